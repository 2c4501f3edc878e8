// The kept K-tile lists against brute force over the element mask a grid stands for: a tile
// is listed exactly when some kept filter element falls in it, in ascending order; block
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
      {MakeConv(1, 4, 4, 40, 24, 3, 1, 1, 0), 16, 8, 32, 16},
  };
  uint32_t seed = 5;
  for (const Case& c : cases) {
    const ConvShape& s = c.shape;
    for (GridPattern pattern : testing::kGridPatterns) {
      SCOPED_TRACE(absl::StrFormat("C %d K %d %dx%d blocks %dx%d tiles %dx%d pattern %d", s.c, s.k,
                                   s.r, s.s, c.bi, c.bo, c.tk, c.tn, static_cast<int>(pattern)));
      const BlockGrid grid = MakeBlockGrid(s, c.bi, c.bo, pattern, seed++);
      const KeptTiles t = ForwardKeptTiles(s, grid, c.tk, c.tn);
      const int c_tiles = (s.c + c.tk - 1) / c.tk, taps = s.r * s.s;
      ASSERT_EQ(t.k_tiles, c_tiles * taps);
      ASSERT_EQ(t.n_tiles, (s.k + c.tn - 1) / c.tn);
      ASSERT_EQ(t.count.size(), static_cast<size_t>(t.n_tiles));
      ASSERT_EQ(t.index.size(), static_cast<size_t>(t.n_tiles) * t.stride);
      const std::vector<uint8_t> mask = grid.Expand(s.k, taps, s.c);  // [out, taps, in]
      for (int j = 0; j < t.n_tiles; ++j) {
        std::vector<int> want;
        for (int tile = 0; tile < t.k_tiles; ++tile) {
          const int ct = tile % c_tiles, tap = tile / c_tiles;
          bool any = false;
          for (int k = j * c.tn; k < std::min(s.k, (j + 1) * c.tn); ++k) {
            for (int ch = ct * c.tk; ch < std::min(s.c, (ct + 1) * c.tk); ++ch) {
              any |= mask[(static_cast<size_t>(k) * taps + tap) * s.c + ch] != 0;
            }
          }
          if (any) want.push_back(tile);
        }
        ASSERT_LE(t.count[j], t.stride);
        const std::vector<int> got(
            t.index.begin() + static_cast<size_t>(j) * t.stride,
            t.index.begin() + static_cast<size_t>(j) * t.stride + t.count[j]);
        EXPECT_EQ(got, want) << "output tile " << j;
      }
      if (pattern == GridPattern::kAll) {
        EXPECT_EQ(t.density(), 1.0);
      }
      if (c.bi % c.tk == 0 && c.bo % c.tn == 0 && s.c % c.bi == 0 && s.k % c.bo == 0) {
        EXPECT_DOUBLE_EQ(t.density(), grid.density());  // aligned: exactly the kept blocks
      }
    }
  }
}

}  // namespace
}  // namespace topiary::kernels
