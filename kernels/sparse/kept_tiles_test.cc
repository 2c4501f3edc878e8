// The kept K-tile lists of both passes against brute force over the element mask a grid
// stands for: a tile is listed exactly when some kept filter element falls in it, in
// ascending order; block
// shapes aligned with the tiles and not, ragged channel counts, 1x1 and 3x3 filters.
#include "kernels/sparse/kept_tiles.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::GridPattern;
using testing::MakeBlockGrid;
using testing::MakeConv;

TEST(KeptTiles, ListExactlyTheTilesWithKeptWeights) {
  struct Case {
    ConvShape shape;
    int bi, bo, tk, tn;
  };
  const Case cases[] = {
      {MakeConv(1, 4, 4, 128, 256, 3, 3, 1, 1), 64, 128, 64, 128},
      {MakeConv(1, 4, 4, 128, 256, 3, 3, 1, 1), 64, 64, 64, 128},  // two columns per tile
      {MakeConv(1, 4, 4, 96, 72, 1, 1, 1, 0), 8, 8, 64, 64},       // ragged C and K
      {MakeConv(1, 4, 4, 256, 128, 3, 3, 2, 1), 128, 64, 64, 64},  // two tiles per row
      {MakeConv(1, 4, 4, 256, 256, 3, 3, 1, 1), 64, 128, 64, 64},
      {MakeConv(1, 4, 4, 40, 24, 3, 1, 1, 0), 16, 8, 32, 16},
  };
  uint32_t seed = 5;
  for (const Case& c : cases) {
    const ConvShape& s = c.shape;
    for (GridPattern pattern : testing::kGridPatterns) {
      SCOPED_TRACE(absl::StrFormat("C %d K %d %dx%d blocks %dx%d tiles %dx%d pattern %d", s.c, s.k,
                                   s.r, s.s, c.bi, c.bo, c.tk, c.tn, static_cast<int>(pattern)));
      const BlockGrid grid = MakeBlockGrid(s, c.bi, c.bo, pattern, seed++);
      const std::vector<uint8_t> mask = grid.Expand(s.k, s.r * s.s, s.c);  // [out, taps, in]
      for (SparsePass pass : {SparsePass::kForward, SparsePass::kBackwardData}) {
        SCOPED_TRACE(SparsePassName(pass));
        // Forward reduces over input channels into output channels; backward data the reverse.
        const bool fwd = pass == SparsePass::kForward;
        const int red = fwd ? s.c : s.k, out = fwd ? s.k : s.c;
        const KeptTiles t = MakeKeptTiles(pass, s, grid, c.tk, c.tn);
        const int c_tiles = (red + c.tk - 1) / c.tk, taps = s.r * s.s;
        ASSERT_EQ(t.k_tiles, c_tiles * taps);
        ASSERT_EQ(t.n_tiles, (out + c.tn - 1) / c.tn);
        ASSERT_EQ(t.count.size(), static_cast<size_t>(t.n_tiles));
        ASSERT_EQ(t.index.size(), static_cast<size_t>(t.n_tiles) * t.stride);
        for (int j = 0; j < t.n_tiles; ++j) {
          std::vector<int> want;
          for (int tile = 0; tile < t.k_tiles; ++tile) {
            const int ct = tile % c_tiles, tap = tile / c_tiles;
            bool any = false;
            for (int o = j * c.tn; o < std::min(out, (j + 1) * c.tn); ++o) {
              for (int r = ct * c.tk; r < std::min(red, (ct + 1) * c.tk); ++r) {
                const int k = fwd ? o : r, ch = fwd ? r : o;
                any |= mask[(static_cast<size_t>(k) * taps + tap) * s.c + ch] != 0;
              }
            }
            if (any) want.push_back(tile);
          }
          ASSERT_LE(t.count[j], t.stride);
          const size_t at = static_cast<size_t>(j) * t.stride;
          const std::vector<int> got(t.index.begin() + at, t.index.begin() + at + t.count[j]);
          EXPECT_EQ(got, want) << "output tile " << j;
        }
        if (pattern == GridPattern::kAll) {
          EXPECT_EQ(t.density(), 1.0);
        }
        const int red_block = fwd ? c.bi : c.bo, out_block = fwd ? c.bo : c.bi;
        if (red_block % c.tk == 0 && out_block % c.tn == 0 && red % red_block == 0 &&
            out % out_block == 0) {
          EXPECT_DOUBLE_EQ(t.density(), grid.density());  // aligned: exactly the kept blocks
        }
      }
    }
  }
}

}  // namespace
}  // namespace topiary::kernels
