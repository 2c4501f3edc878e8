// The kept K-tile lists of both passes against brute force over the element mask a grid
// stands for: a tile is listed exactly when some kept filter element falls in it, taps in
// ascending order and the same channel tiles in the same order at every tap; block shapes
// aligned with the tiles and not, ragged channel counts, 1x1 and 3x3 filters, in each order:
// ascending, rotated (from output tile j's (j mod kept)-th), or coloured (on balanced grids,
// no two output tiles name one channel tile at the same place, below).
#include "kernels/sparse/kept_tiles.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
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
      for (const auto& [pass, order] :
           {std::pair{SparsePass::kForward, KeptOrder::kAscending},
            std::pair{SparsePass::kForward, KeptOrder::kRotated},
            std::pair{SparsePass::kForward, KeptOrder::kColoured},
            std::pair{SparsePass::kBackwardData, KeptOrder::kAscending},
            std::pair{SparsePass::kBackwardData, KeptOrder::kRotated},
            std::pair{SparsePass::kBackwardData, KeptOrder::kColoured}}) {
        SCOPED_TRACE(
            absl::StrFormat("%s, order %d", SparsePassName(pass), static_cast<int>(order)));
        // Forward reduces over input channels into output channels; backward data the reverse.
        const bool fwd = pass == SparsePass::kForward;
        const int red = fwd ? s.c : s.k, out = fwd ? s.k : s.c;
        const KeptTiles t = MakeKeptTiles(pass, s, grid, c.tk, c.tn, order);
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
          ASSERT_EQ(t.count[j] % taps, 0);
          const size_t at = static_cast<size_t>(j) * t.stride;
          const int per_tap = t.count[j] / taps;
          std::vector<int> got(t.index.begin() + at, t.index.begin() + at + t.count[j]);
          for (int i = 0; i < t.count[j]; ++i) {  // tap 0's order at every tap
            EXPECT_EQ(got[i], got[i % per_tap] + c_tiles * (i / per_tap)) << "entry " << i;
          }
          if (order != KeptOrder::kColoured) {  // tap 0's: ascending, rotated or not
            const int first = order == KeptOrder::kRotated && per_tap > 0 ? j % per_tap : 0;
            for (int b = 0; b < per_tap; ++b) {
              EXPECT_EQ(got[b], want[(b + first) % per_tap]) << "output tile " << j;
            }
          }
          std::sort(got.begin(), got.end());
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

// The coloured order on balanced grids (every output tile needs as many channel tiles as every
// channel tile has output tiles needing it): at each place of the lists, every output tile
// names a different channel tile. Random balanced grids of 2 to 8 blocks a side, each
// fraction kept, both passes.
TEST(KeptTiles, ColouredListsNameDistinctChannelTilesAtEachPlaceOnBalancedGrids) {
  std::mt19937 gen(11);
  int checked = 0;
  for (int side = 2; side <= 8; ++side) {
    for (int keep = 1; keep <= side; ++keep) {
      for (int trial = 0; trial < 20; ++trial) {
        // Column c keeps rows (c + shift_i) mod side for keep distinct shifts: each row and
        // column keeps `keep` blocks; the rows and columns are then shuffled.
        std::vector<int> shifts(side), rows(side), cols(side);
        std::iota(shifts.begin(), shifts.end(), 0);
        std::iota(rows.begin(), rows.end(), 0);
        std::iota(cols.begin(), cols.end(), 0);
        std::shuffle(shifts.begin(), shifts.end(), gen);
        std::shuffle(rows.begin(), rows.end(), gen);
        std::shuffle(cols.begin(), cols.end(), gen);
        const ConvShape s = MakeConv(1, 5, 5, 64 * side, 64 * side, 3, 3, 1, 1);
        BlockGrid grid = BlockGrid::Dense(s.c, s.k, 64, 64);
        std::fill(grid.kept.begin(), grid.kept.end(), 0);
        for (int c = 0; c < side; ++c) {
          for (int i = 0; i < keep; ++i) grid.at(rows[(c + shifts[i]) % side], cols[c]) = 1;
        }
        for (SparsePass pass : {SparsePass::kForward, SparsePass::kBackwardData}) {
          const KeptTiles t = MakeKeptTiles(pass, s, grid, 64, 64, KeptOrder::kColoured);
          SCOPED_TRACE(absl::StrFormat("%dx%d keeping %d, trial %d, %s", side, side, keep, trial,
                                       SparsePassName(pass)));
          for (int place = 0; place < keep; ++place) {
            std::vector<int> named;
            for (int j = 0; j < t.n_tiles; ++j) {
              ASSERT_EQ(t.count[j], keep * 9);
              named.push_back(t.index[static_cast<size_t>(j) * t.stride + place]);
            }
            std::sort(named.begin(), named.end());
            EXPECT_EQ(std::adjacent_find(named.begin(), named.end()), named.end())
                << "place " << place;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 20 * 35);  // sides 2..8, each keeping 1..side, both passes
}

// The filter gradient's kept tiles against brute force over the element mask, and the work
// split, replayed CTA by CTA: every (kept tile, pixel tile) pair summed exactly once, into a
// running sum of that tile alone that is stored to a slot of that tile; windows in order;
// each CTA's work per window within two pixel tiles of the others'; a tile's slots in CTA
// order.
TEST(KeptTiles, FilterSplitCoversEachKeptTileOnce) {
  struct Case {
    ConvShape shape;
    int bi, bo, tm, tn, tk, phases, ctas;
  };
  const Case cases[] = {
      {MakeConv(2, 7, 7, 256, 256, 3, 3, 1, 1), 64, 128, 128, 64, 64, 1, 132},
      {MakeConv(4, 7, 7, 256, 256, 3, 3, 1, 1), 64, 128, 128, 64, 16, 3, 132},
      {MakeConv(1, 9, 11, 128, 256, 3, 3, 2, 1), 64, 128, 128, 64, 64, 2, 7},
      {MakeConv(3, 5, 5, 192, 128, 1, 1, 1, 0), 64, 64, 128, 64, 8, 4, 132},    // 2 columns a tile
      {MakeConv(1, 4, 4, 96, 72, 3, 3, 1, 1), 8, 8, 64, 64, 4, 3, 5},           // ragged C and K
      {MakeConv(2, 7, 7, 512, 512, 3, 3, 1, 1), 64, 128, 128, 64, 16, 4, 132},  // kept > ctas
      {MakeConv(1, 2, 2, 64, 64, 1, 1, 1, 0), 64, 64, 64, 64, 64, 4, 132},      // one pixel tile
  };
  uint32_t seed = 50;
  for (const Case& c : cases) {
    const ConvShape& s = c.shape;
    for (GridPattern pattern : testing::kGridPatterns) {
      SCOPED_TRACE(absl::StrFormat(
          "C %d K %d blocks %dx%d tiles %dx%dx%d phases %d ctas %d pattern %d", s.c, s.k, c.bi,
          c.bo, c.tm, c.tn, c.tk, c.phases, c.ctas, static_cast<int>(pattern)));
      const BlockGrid grid = MakeBlockGrid(s, c.bi, c.bo, pattern, seed++);
      const std::vector<uint8_t> mask = grid.Expand(s.k, s.r * s.s, s.c);  // [out, taps, in]
      const FilterSplit f = MakeFilterSplit(s, grid, c.tm, c.tn, c.tk, c.phases, c.ctas);
      const int c_tiles = (s.c + c.tn - 1) / c.tn, taps = s.r * s.s;
      const int64_t pixels = static_cast<int64_t>(s.n) * s.ho() * s.wo();
      ASSERT_EQ(f.m_tiles, (s.k + c.tm - 1) / c.tm);
      ASSERT_EQ(f.n_tiles, c_tiles * taps);
      ASSERT_EQ(f.k_tiles, (pixels + c.tk - 1) / c.tk);
      ASSERT_EQ(f.slot.size(), static_cast<size_t>(f.m_tiles) * f.n_tiles);
      int kept = 0;
      for (int m = 0; m < f.m_tiles; ++m) {
        for (int n = 0; n < f.n_tiles; ++n) {
          const int ct = n % c_tiles, tap = n / c_tiles;
          bool any = false;
          for (int k = m * c.tm; k < std::min(s.k, (m + 1) * c.tm); ++k) {
            for (int ch = ct * c.tn; ch < std::min(s.c, (ct + 1) * c.tn); ++ch) {
              any |= mask[(static_cast<size_t>(k) * taps + tap) * s.c + ch] != 0;
            }
          }
          const int slot = f.slot[static_cast<size_t>(m) * f.n_tiles + n];
          EXPECT_EQ(slot >= 0, any) << "tile " << m << "," << n;
          if (slot >= 0) {
            EXPECT_EQ(slot, kept++);  // numbered in tile order
            EXPECT_EQ(f.kept_tiles[slot], m * f.n_tiles + n);
          }
        }
      }
      ASSERT_EQ(f.kept(), kept);
      EXPECT_EQ(f.ctas, std::min<int64_t>(c.ctas, int64_t{kept} * f.k_tiles));
      EXPECT_EQ(f.phases, kept > f.ctas ? 1 : std::min(c.phases, f.k_tiles));
      auto window = [&](int p) { return static_cast<int>(int64_t{f.k_tiles} * p / f.phases); };
      ASSERT_EQ(f.cta_begin.size(), static_cast<size_t>(f.ctas) + 1);
      const size_t segments = f.seg_tile.size();
      ASSERT_EQ(f.cta_begin.back(), static_cast<int>(segments));
      for (const auto* v : {&f.seg_k, &f.seg_count, &f.seg_piece, &f.seg_store}) {
        ASSERT_EQ(v->size(), segments);
      }
      ASSERT_EQ(f.tile_begin.size(), static_cast<size_t>(kept) + 1);
      // Replay each CTA: its running sums (which tile, which pixel tiles) and their stores.
      std::vector<std::vector<std::pair<int, int>>> covered(kept);  // per tile: (k, count)
      std::vector<int> stored_by(f.partials(), -1);                 // the CTA that stored a slot
      std::vector<int64_t> least(f.phases, INT64_MAX), most(f.phases, 0);
      for (int cta = 0; cta < f.ctas; ++cta) {
        struct Running {
          int tile = -1;
          std::vector<std::pair<int, int>> ranges;
        } running[2];
        std::vector<int64_t> work(f.phases, 0);
        int phase = 0;
        for (int seg = f.cta_begin[cta]; seg < f.cta_begin[cta + 1]; ++seg) {
          ASSERT_GE(f.seg_tile[seg], 0);
          ASSERT_LT(f.seg_tile[seg], kept);
          ASSERT_GT(f.seg_count[seg], 0);
          while (phase + 1 < f.phases && f.seg_k[seg] >= window(phase + 1)) ++phase;
          EXPECT_GE(f.seg_k[seg], window(phase)) << "windows out of order";
          EXPECT_LE(f.seg_k[seg] + f.seg_count[seg], window(phase + 1)) << "crosses a window";
          work[phase] += f.seg_count[seg];
          ASSERT_TRUE(f.seg_piece[seg] == 0 || f.seg_piece[seg] == 1);
          if (f.phases == 1) {
            EXPECT_EQ(f.seg_piece[seg], 0);
          }
          Running& r = running[f.seg_piece[seg]];
          if (r.tile >= 0) {
            EXPECT_EQ(r.tile, f.seg_tile[seg]) << "one tile per running sum";
          }
          r.tile = f.seg_tile[seg];
          r.ranges.push_back({f.seg_k[seg], f.seg_count[seg]});
          if (f.seg_store[seg] >= 0) {
            const int slot = f.seg_store[seg];
            ASSERT_LT(slot, f.partials());
            EXPECT_EQ(stored_by[slot], -1) << "slot " << slot << " stored twice";
            stored_by[slot] = cta;
            EXPECT_GE(slot, f.tile_begin[r.tile]);
            EXPECT_LT(slot, f.tile_begin[r.tile + 1]);
            for (const auto& range : r.ranges) covered[r.tile].push_back(range);
            r = Running{};
          }
        }
        for (const Running& r : running) EXPECT_EQ(r.tile, -1) << "a sum never stored";
        for (int p = 0; p < f.phases; ++p) {
          least[p] = std::min(least[p], work[p]);
          most[p] = std::max(most[p], work[p]);
        }
      }
      for (int p = 0; p < f.phases && f.ctas > 0; ++p) {
        EXPECT_LE(most[p] - least[p], 2) << "phase " << p;
      }
      for (int slot = 0; slot < f.partials(); ++slot) {
        EXPECT_GE(stored_by[slot], 0) << "slot " << slot << " never stored";
      }
      for (int t = 0; t < kept; ++t) {
        for (int slot = f.tile_begin[t] + 1; slot < f.tile_begin[t + 1]; ++slot) {
          EXPECT_LT(stored_by[slot - 1], stored_by[slot]) << "slots in CTA order";
        }
        std::sort(covered[t].begin(), covered[t].end());
        int next = 0;
        for (const auto& [k, count] : covered[t]) {
          EXPECT_EQ(k, next) << "kept tile " << t;
          next = k + count;
        }
        EXPECT_EQ(next, f.k_tiles) << "kept tile " << t;
      }
    }
  }
}

}  // namespace
}  // namespace topiary::kernels
