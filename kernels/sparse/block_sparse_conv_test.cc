// The block-sparse convolution's CPU reference against a float64 dense convolution of the
// masked filter, on random grids and awkward shapes (stride 2, 1x1, odd and ragged channel
// counts, batch 1, non-square filters, every block kept, one block kept per row), block shapes
// other than 8x8, and the grid checks.
#include "kernels/sparse/block_sparse_conv.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::MakeConv;
using testing::RandomFloats;
using testing::RelError;

using testing::GridPattern;
using testing::MakeBlockGrid;

// The filter with every entry outside a kept block set to 0.
std::vector<float> Masked(const ConvShape& s, const BlockGrid& g, std::vector<float> w) {
  for (int k = 0; k < s.k; ++k) {
    for (int t = 0; t < s.r * s.s; ++t) {
      for (int c = 0; c < s.c; ++c) {
        if (!g.Kept(c / g.block_in, k / g.block_out)) {
          w[(static_cast<size_t>(k) * s.r * s.s + t) * s.c + c] = 0.0f;
        }
      }
    }
  }
  return w;
}

// The dense convolution's three passes in double precision.
struct DenseRef {
  std::vector<double> y, dx, dw, dbias;
};
DenseRef Dense(const ConvShape& s, const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<float>& bias, const std::vector<float>& dy) {
  const int ho = s.ho(), wo = s.wo();
  DenseRef r{std::vector<double>(static_cast<size_t>(s.n) * ho * wo * s.k),
             std::vector<double>(x.size()), std::vector<double>(w.size()),
             std::vector<double>(s.k)};
  for (int n = 0; n < s.n; ++n) {
    for (int oy = 0; oy < ho; ++oy) {
      for (int ox = 0; ox < wo; ++ox) {
        const size_t p = (static_cast<size_t>(n) * ho + oy) * wo + ox;
        for (int k = 0; k < s.k; ++k) {
          double acc = bias[k];
          const double g = dy[p * s.k + k];
          r.dbias[k] += g;
          for (int i = 0; i < s.r; ++i) {
            for (int j = 0; j < s.s; ++j) {
              const int iy = oy * s.stride_h - s.pad_h + i, ix = ox * s.stride_w - s.pad_w + j;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              const size_t xi = ((static_cast<size_t>(n) * s.h + iy) * s.w + ix) * s.c;
              const size_t wi = ((static_cast<size_t>(k) * s.r + i) * s.s + j) * s.c;
              for (int c = 0; c < s.c; ++c) {
                acc += static_cast<double>(x[xi + c]) * w[wi + c];
                r.dx[xi + c] += g * w[wi + c];
                r.dw[wi + c] += g * x[xi + c];
              }
            }
          }
          r.y[p * s.k + k] = acc;
        }
      }
    }
  }
  return r;
}

TEST(BlockSparseConv, MatchesDenseConvOfMaskedFilter) {
  uint32_t seed = 1;
  const testing::BlockConvCase cases[] = {
      {MakeConv(2, 6, 6, 16, 16, 3, 3, 1, 1), 8, 8},
      {MakeConv(1, 7, 7, 24, 16, 3, 3, 2, 1), 8, 8},
      {MakeConv(3, 5, 5, 16, 32, 1, 1, 1, 0), 8, 8},
      {MakeConv(2, 9, 7, 13, 11, 3, 3, 2, 1), 8, 8},
      {MakeConv(2, 6, 5, 17, 9, 1, 1, 2, 0), 4, 4},
      {MakeConv(1, 8, 8, 32, 24, 5, 3, 1, 2), 16, 8},
      {MakeConv(2, 5, 5, 16, 32, 3, 3, 1, 1), 4, 16},
      {MakeConv(2, 6, 6, 5, 7, 3, 3, 1, 0), 1, 1},
      {MakeConv(1, 3, 3, 8, 8, 3, 3, 1, 1), 8, 8},
  };
  for (const testing::BlockConvCase& c : cases) {
    const ConvShape& s = c.shape;
    for (GridPattern pattern : testing::kGridPatterns) {
      SCOPED_TRACE(absl::StrFormat("%dx%dx%dx%d k%d %dx%d stride %d, blocks %dx%d, pattern %d", s.n,
                                   s.h, s.w, s.c, s.k, s.r, s.s, s.stride_h, c.bi, c.bo,
                                   static_cast<int>(pattern)));
      const BlockGrid g = MakeBlockGrid(s, c.bi, c.bo, pattern, seed++);
      ASSERT_TRUE(CheckBlockGrid(s, g).ok());
      const size_t nx = static_cast<size_t>(s.n) * s.h * s.w * s.c;
      const size_t ny = static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k;
      const auto x = RandomFloats(nx, seed++), dy = RandomFloats(ny, seed++);
      const auto bias = RandomFloats(s.k, seed++);
      // The sparse kernels read the filter in place: give them one with nonzero entries
      // outside the kept blocks, which they must ignore.
      const auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), seed++);
      const DenseRef ref = Dense(s, x, Masked(s, g, w), bias, dy);
      std::vector<float> y(ny), dx(nx), dw(w.size(), 7.0f), dbias(s.k);
      BlockSparseConv2dForwardCpu(s, g, x.data(), w.data(), bias.data(), y.data());
      BlockSparseConv2dBackwardDataCpu(s, g, dy.data(), w.data(), dx.data());
      BlockSparseConv2dBackwardFilterCpu(s, g, x.data(), dy.data(), dw.data(), dbias.data());
      EXPECT_LT(RelError(y, ref.y), 1e-5);
      EXPECT_LT(RelError(dx, ref.dx), 1e-5);
      // dw is the dense gradient on kept blocks and exactly 0 elsewhere.
      const auto keep = Masked(s, g, std::vector<float>(w.size(), 1.0f));
      std::vector<double> ref_dw = ref.dw;
      for (size_t i = 0; i < ref_dw.size(); ++i) ref_dw[i] *= keep[i];
      EXPECT_LT(RelError(dw, ref_dw), 1e-5);
      const auto zeros = Masked(s, g, dw);
      EXPECT_EQ(zeros, dw) << "an entry outside the kept blocks is not 0";
      EXPECT_LT(RelError(dbias, ref.dbias), 1e-5);
    }
  }
}

TEST(BlockSparseConv, DensityCountsKeptBlocks) {
  BlockGrid g;
  g.rows = 2;
  g.cols = 4;
  g.kept = {1, 0, 0, 1, 1, 1, 0, 0};
  EXPECT_DOUBLE_EQ(g.density(), 0.5);
}

TEST(BlockSparseConv, RejectsGridsThatDoNotFit) {
  const ConvShape s = MakeConv(1, 4, 4, 16, 24, 3, 3, 1, 1);
  BlockGrid g = MakeBlockGrid(s, 8, 8, GridPattern::kAll, 0);
  EXPECT_TRUE(CheckBlockGrid(s, g).ok());
  BlockGrid wrong_rows = g;
  wrong_rows.rows = 3;
  EXPECT_NE(CheckBlockGrid(s, wrong_rows).message().find("does not fit"), std::string::npos);
  BlockGrid short_list = g;
  short_list.kept.pop_back();
  EXPECT_NE(CheckBlockGrid(s, short_list).message().find("entries"), std::string::npos);
  BlockGrid bad_value = g;
  bad_value.kept[0] = 2;
  EXPECT_NE(CheckBlockGrid(s, bad_value).message().find("0 or 1"), std::string::npos);
  BlockGrid zero_block = g;
  zero_block.block_in = 0;
  EXPECT_NE(CheckBlockGrid(s, zero_block).message().find(">= 1"), std::string::npos);
}

}  // namespace
}  // namespace topiary::kernels
