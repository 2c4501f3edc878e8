#include "kernels/norm_pool/pooling.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::Dot;
using testing::MakePool;
using testing::NumericalGradient;
using testing::RandomFloats;
using testing::RelError;
using testing::ToDouble;

// Double reference of both poolings (avg counts padding as zeros).
std::vector<double> RefPool(const PoolShape& sh, const std::vector<double>& x, bool max) {
  std::vector<double> y(static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.c);
  for (int n = 0; n < sh.n; ++n)
    for (int oh = 0; oh < sh.ho(); ++oh)
      for (int ow = 0; ow < sh.wo(); ++ow)
        for (int c = 0; c < sh.c; ++c) {
          double acc = max ? -std::numeric_limits<double>::infinity() : 0.0;
          for (int r = 0; r < sh.r; ++r)
            for (int s = 0; s < sh.s; ++s) {
              const int ih = oh * sh.stride_h - sh.pad_h + r, iw = ow * sh.stride_w - sh.pad_w + s;
              if (ih < 0 || ih >= sh.h || iw < 0 || iw >= sh.w) continue;
              const double v = x[((static_cast<size_t>(n) * sh.h + ih) * sh.w + iw) * sh.c + c];
              acc = max ? std::max(acc, v) : acc + v;
            }
          y[((static_cast<size_t>(n) * sh.ho() + oh) * sh.wo() + ow) * sh.c + c] =
              max ? acc : acc / (sh.r * sh.s);
        }
  return y;
}

class PoolTest : public ::testing::TestWithParam<PoolShape> {};

TEST_P(PoolTest, MaxAndAvgMatchReferenceAndFiniteDifferences) {
  const PoolShape sh = GetParam();
  ASSERT_TRUE(CheckPoolShape(sh).ok());
  const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
  const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.c;
  // Distinct values, so max pooling is differentiable at x and finite differences apply.
  auto x = RandomFloats(nx, 11);
  for (size_t i = 0; i < nx; ++i) x[i] += 0.001f * static_cast<float>(i);
  auto g = RandomFloats(ny, 12);
  auto xd = ToDouble(x), gd = ToDouble(g);
  for (bool max : {true, false}) {
    std::vector<float> y(ny), dx(nx, 7.0f);
    if (max) {
      MaxPoolForwardCpu(sh, x.data(), y.data());
      MaxPoolBackwardCpu(sh, x.data(), y.data(), g.data(), dx.data());
    } else {
      AvgPoolForwardCpu(sh, x.data(), y.data());
      AvgPoolBackwardCpu(sh, g.data(), dx.data());
    }
    EXPECT_LT(RelError(y, RefPool(sh, xd, max)), 1e-6) << (max ? "max" : "avg");
    auto num = NumericalGradient(
        [&](std::vector<double>& v) { return Dot(RefPool(sh, v, max), gd); }, xd, 1e-6);
    EXPECT_LT(RelError(dx, num), 1e-4) << (max ? "max" : "avg");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PoolTest,
                         ::testing::Values(MakePool(2, 4, 4, 3, 2, 2, 0),
                                           MakePool(1, 7, 5, 2, 3, 2, 1),
                                           MakePool(2, 5, 5, 1, 2, 2, 0),
                                           MakePool(1, 9, 9, 4, 3, 2, 1)));

TEST(Pooling, MaxPoolTiesRouteToFirstPosition) {
  PoolShape sh = MakePool(1, 2, 2, 1, 2, 2, 0);
  std::vector<float> x = {1.0f, 1.0f, 1.0f, 1.0f}, y(1), g = {5.0f}, dx(4);
  MaxPoolForwardCpu(sh, x.data(), y.data());
  MaxPoolBackwardCpu(sh, x.data(), y.data(), g.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{5.0f, 0.0f, 0.0f, 0.0f}));
}

TEST(Pooling, GlobalAverage) {
  const int n = 3, hw = 5, c = 4;
  auto x = RandomFloats(n * hw * c, 13), g = RandomFloats(n * c, 14);
  std::vector<float> y(n * c), dx(n * hw * c);
  GlobalAvgPoolForwardCpu(n, hw, c, x.data(), y.data());
  GlobalAvgPoolBackwardCpu(n, hw, c, g.data(), dx.data());
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < c; ++j) {
      double s = 0;
      for (int p = 0; p < hw; ++p) s += x[(i * hw + p) * c + j];
      EXPECT_NEAR(y[i * c + j], s / hw, 1e-6);
      for (int p = 0; p < hw; ++p) EXPECT_FLOAT_EQ(dx[(i * hw + p) * c + j], g[i * c + j] / hw);
    }
}

TEST(Pooling, RejectsBadShapes) {
  EXPECT_FALSE(CheckPoolShape(MakePool(1, 4, 4, 1, 2, 2, 2)).ok());  // padding > half window
  EXPECT_FALSE(CheckPoolShape(MakePool(1, 1, 1, 1, 3, 1, 0)).ok());  // window > input
}

TEST(Elementwise, FusedAddReluWithASecondGradient) {
  auto y = RandomFloats(99, 21), g = RandomFloats(99, 22), g2 = RandomFloats(99, 23);
  std::vector<float> da(99), db(99);
  AddReluBackwardSumCpu(99, y.data(), g.data(), g2.data(), da.data(), db.data());
  for (int i = 0; i < 99; ++i) {
    EXPECT_EQ(da[i], y[i] > 0 ? g[i] + g2[i] : 0.0f) << i;
    EXPECT_EQ(db[i], da[i]);
  }
}

TEST(Elementwise, FusedAddRelu) {
  auto a = RandomFloats(99, 18), b = RandomFloats(99, 19), g = RandomFloats(99, 20);
  std::vector<float> y(99), da(99), db(99);
  AddReluCpu(99, a.data(), b.data(), y.data());
  AddReluBackwardCpu(99, y.data(), g.data(), da.data(), db.data());
  for (int i = 0; i < 99; ++i) {
    const float s = a[i] + b[i];
    EXPECT_EQ(y[i], s > 0 ? s : 0.0f);
    EXPECT_EQ(da[i], s > 0 ? g[i] : 0.0f);
    EXPECT_EQ(db[i], da[i]);
  }
}

TEST(Elementwise, ReluAndAdd) {
  auto x = RandomFloats(100, 15), b = RandomFloats(100, 16), g = RandomFloats(100, 17);
  std::vector<float> y(100), dx(100), s(100);
  ReluForwardCpu(100, x.data(), y.data());
  ReluBackwardCpu(100, y.data(), g.data(), dx.data());
  AddCpu(100, x.data(), b.data(), s.data());
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(y[i], x[i] > 0 ? x[i] : 0.0f);
    EXPECT_EQ(dx[i], x[i] > 0 ? g[i] : 0.0f);
    EXPECT_EQ(s[i], x[i] + b[i]);
  }
}

}  // namespace
}  // namespace topiary::kernels
