// Grouped convolution, ReLU6 and channel concatenation on the CPU against float64 references
// (the CUDA twins are checked against these in cuda_test).
#include "kernels/conv/grouped_conv.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::MakeConv;
using testing::RandomFloats;
using testing::RelError;

struct Grads {
  std::vector<double> y, dx, dw, db;
};

// Forward and both gradients in double, from the definition: every (output, tap, channel)
// term visited once.
Grads Reference(const GroupedConvShape& g, const std::vector<float>& x, const std::vector<float>& w,
                const std::vector<float>& b, const std::vector<float>& dy) {
  const ConvShape& s = g.conv;
  const int ho = s.ho(), wo = s.wo(), cg = g.cg(), kg = g.kg();
  Grads r;
  r.y.assign(static_cast<size_t>(s.n) * ho * wo * s.k, 0);
  r.dx.assign(x.size(), 0);
  r.dw.assign(w.size(), 0);
  r.db.assign(s.k, 0);
  for (int n = 0; n < s.n; ++n)
    for (int p = 0; p < ho; ++p)
      for (int q = 0; q < wo; ++q)
        for (int k = 0; k < s.k; ++k) {
          const size_t o = ((static_cast<size_t>(n) * ho + p) * wo + q) * s.k + k;
          double acc = b[k];
          r.db[k] += dy[o];
          for (int i = 0; i < s.r; ++i)
            for (int j = 0; j < s.s; ++j) {
              const int h = p * s.stride_h - s.pad_h + i, c = q * s.stride_w - s.pad_w + j;
              if (h < 0 || h >= s.h || c < 0 || c >= s.w) continue;
              for (int ci = 0; ci < cg; ++ci) {
                const size_t xi =
                    ((static_cast<size_t>(n) * s.h + h) * s.w + c) * s.c + (k / kg) * cg + ci;
                const size_t wi = ((static_cast<size_t>(k) * s.r + i) * s.s + j) * cg + ci;
                acc += static_cast<double>(x[xi]) * w[wi];
                r.dx[xi] += static_cast<double>(dy[o]) * w[wi];
                r.dw[wi] += static_cast<double>(dy[o]) * x[xi];
              }
            }
          r.y[o] = acc;
        }
  return r;
}

class GroupedConvTest : public ::testing::TestWithParam<std::pair<ConvShape, int>> {};

TEST_P(GroupedConvTest, MatchesFloat64Reference) {
  GroupedConvShape g;
  g.conv = GetParam().first;
  g.groups = GetParam().second;
  ASSERT_TRUE(CheckGroupedConvShape(g).ok());
  const ConvShape& s = g.conv;
  const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, 1);
  const auto w = RandomFloats(static_cast<size_t>(s.k) * s.r * s.s * g.cg(), 2);
  const auto b = RandomFloats(s.k, 3);
  const auto dy = RandomFloats(static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k, 4);
  const Grads ref = Reference(g, x, w, b, dy);
  std::vector<float> y(ref.y.size()), dx(x.size(), 7.0f), dw(w.size(), 7.0f), db(s.k, 7.0f);
  GroupedConvForwardCpu(g, x.data(), w.data(), b.data(), y.data());
  GroupedConvBackwardDataCpu(g, dy.data(), w.data(), dx.data());
  GroupedConvBackwardFilterCpu(g, x.data(), dy.data(), dw.data(), db.data());
  EXPECT_LT(RelError(y, ref.y), 1e-5);
  EXPECT_LT(RelError(dx, ref.dx), 1e-5);
  EXPECT_LT(RelError(dw, ref.dw), 1e-5);
  EXPECT_LT(RelError(db, ref.db), 1e-5);
}

// Depthwise (groups = C), grouped, stride 2, 1x1, odd sizes, batch 1, one group of one.
INSTANTIATE_TEST_SUITE_P(Shapes, GroupedConvTest,
                         ::testing::Values(std::pair{MakeConv(2, 7, 5, 6, 6, 3, 3, 1, 1), 6},
                                           std::pair{MakeConv(1, 9, 9, 8, 16, 3, 3, 2, 1), 8},
                                           std::pair{MakeConv(3, 6, 7, 12, 6, 3, 3, 1, 0), 3},
                                           std::pair{MakeConv(2, 5, 5, 4, 8, 1, 1, 1, 0), 2},
                                           std::pair{MakeConv(1, 11, 11, 3, 3, 5, 5, 2, 2), 3},
                                           std::pair{MakeConv(2, 4, 4, 2, 2, 3, 3, 2, 1), 2}));

TEST(GroupedConvShapeTest, RefusesGroupsThatDoNotDivide) {
  GroupedConvShape g;
  g.conv = MakeConv(1, 4, 4, 6, 4, 3, 3, 1, 1);
  g.groups = 4;  // divides K = 4, not C = 6
  EXPECT_FALSE(CheckGroupedConvShape(g).ok());
  g.groups = 0;
  EXPECT_FALSE(CheckGroupedConvShape(g).ok());
}

TEST(Relu6Test, ClipsAndPassesGradientInside) {
  const std::vector<float> x = {-1, 0, 0.5f, 5.99f, 6, 7};
  std::vector<float> y(x.size()), dx(x.size());
  Relu6ForwardCpu(x.size(), x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{0, 0, 0.5f, 5.99f, 6, 6}));
  const std::vector<float> dy(x.size(), 2.0f);
  Relu6BackwardCpu(x.size(), y.data(), dy.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{0, 0, 2, 2, 0, 0}));
}

TEST(ConcatChannelsTest, ConcatThenSplitRoundTrips) {
  const int rows = 5, a = 3, b = 2;
  const auto xa = RandomFloats(rows * a, 1), xb = RandomFloats(rows * b, 2);
  std::vector<float> y(rows * (a + b)), ga(rows * a), gb(rows * b);
  ConcatChannelsCpu(rows, a, a + b, 0, xa.data(), y.data());
  ConcatChannelsCpu(rows, b, a + b, a, xb.data(), y.data());
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < a; ++j) EXPECT_EQ(y[i * (a + b) + j], xa[i * a + j]);
    for (int j = 0; j < b; ++j) EXPECT_EQ(y[i * (a + b) + a + j], xb[i * b + j]);
  }
  SplitChannelsCpu(rows, a, a + b, 0, y.data(), ga.data());
  SplitChannelsCpu(rows, b, a + b, a, y.data(), gb.data());
  EXPECT_EQ(ga, xa);
  EXPECT_EQ(gb, xb);
}

}  // namespace
}  // namespace topiary::kernels
