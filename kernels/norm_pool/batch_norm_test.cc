#include "kernels/norm_pool/batch_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/runtime/parallel.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::Dot;
using testing::NumericalGradient;
using testing::RandomFloats;
using testing::RelError;
using testing::ToDouble;

// Training-mode batch norm in double; x, gamma, beta packed as one vector for finite
// differences: [x (m*c) | gamma (c) | beta (c)].
std::vector<double> RefForward(int64_t m, int c, const std::vector<double>& p) {
  std::vector<double> y(m * c);
  for (int j = 0; j < c; ++j) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < m; ++i) mean += p[i * c + j];
    mean /= m;
    for (int64_t i = 0; i < m; ++i) var += (p[i * c + j] - mean) * (p[i * c + j] - mean);
    var /= m;
    for (int64_t i = 0; i < m; ++i)
      y[i * c + j] =
          (p[i * c + j] - mean) / std::sqrt(var + 1e-5) * p[m * c + j] + p[m * c + c + j];
  }
  return y;
}

TEST(BatchNorm, TrainForwardBackwardMatchReference) {
  for (int threads : {1, 3}) {
    SetCpuThreads(threads);
    for (auto [m, c] : {std::pair<int64_t, int>{7, 3}, {64, 16}, {2, 1}}) {
      BatchNormShape sh{m, c};
      std::vector<float> cws(BatchNormWorkspaceFloatsCpu(sh));
      auto x = RandomFloats(m * c, 1, -2.0f, 3.0f), gamma = RandomFloats(c, 2, 0.5f, 1.5f);
      auto beta = RandomFloats(c, 3), g = RandomFloats(m * c, 4);
      std::vector<float> rm(c, 0.5f), rv(c, 2.0f), mean(c), inv(c), y(m * c);
      ASSERT_TRUE(BatchNormForwardTrainCpu(sh, x.data(), gamma.data(), beta.data(), rm.data(),
                                           rv.data(), mean.data(), inv.data(), y.data(), cws.data())
                      .ok());
      std::vector<double> packed = ToDouble(x);
      packed.insert(packed.end(), gamma.begin(), gamma.end());
      packed.insert(packed.end(), beta.begin(), beta.end());
      EXPECT_LT(RelError(y, RefForward(m, c, packed)), 1e-5) << "m=" << m;

      // Running statistics: momentum 0.1, unbiased variance.
      for (int j = 0; j < c; ++j) {
        double mu = 0, var = 0;
        for (int64_t i = 0; i < m; ++i) mu += x[i * c + j];
        mu /= m;
        for (int64_t i = 0; i < m; ++i) var += (x[i * c + j] - mu) * (x[i * c + j] - mu);
        EXPECT_NEAR(rm[j], 0.9 * 0.5 + 0.1 * mu, 1e-5);
        EXPECT_NEAR(rv[j], 0.9 * 2.0 + 0.1 * var / (m - 1), 1e-4);
      }

      std::vector<float> dx(m * c), dgamma(c), dbeta(c);
      ASSERT_TRUE(BatchNormBackwardCpu(sh, x.data(), nullptr, g.data(), gamma.data(), mean.data(),
                                       inv.data(), dx.data(), dgamma.data(), dbeta.data(),
                                       cws.data())
                      .ok());
      auto gd = ToDouble(g);
      auto num = NumericalGradient(
          [&](std::vector<double>& p) { return Dot(RefForward(m, c, p), gd); }, packed, 1e-4);
      std::vector<float> analytic = dx;
      analytic.insert(analytic.end(), dgamma.begin(), dgamma.end());
      analytic.insert(analytic.end(), dbeta.begin(), dbeta.end());
      EXPECT_LT(RelError(analytic, num), 2e-4) << "m=" << m << " threads=" << threads;
    }
  }
}

// With the fused ReLU: y = max(0, bn(x)), and the backward pass equals BN's backward of the
// gradient masked by y > 0.
TEST(BatchNorm, FusedReluMatchesSeparateRelu) {
  for (int threads : {1, 2}) {
    SetCpuThreads(threads);
    const int64_t m = 50;
    const int c = 6;
    BatchNormShape plain{m, c}, fused{m, c};
    std::vector<float> cws(BatchNormWorkspaceFloatsCpu(plain));
    fused.relu = true;
    auto x = RandomFloats(m * c, 21, -2.0f, 2.0f), gamma = RandomFloats(c, 22, 0.5f, 1.5f);
    auto beta = RandomFloats(c, 23), g = RandomFloats(m * c, 24);
    std::vector<float> rm(c, 0.0f), rv(c, 1.0f), mean(c), inv(c), y(m * c), yf(m * c);
    ASSERT_TRUE(BatchNormForwardTrainCpu(plain, x.data(), gamma.data(), beta.data(), rm.data(),
                                         rv.data(), mean.data(), inv.data(), y.data(), cws.data())
                    .ok());
    ASSERT_TRUE(BatchNormForwardTrainCpu(fused, x.data(), gamma.data(), beta.data(), rm.data(),
                                         rv.data(), mean.data(), inv.data(), yf.data(), cws.data())
                    .ok());
    std::vector<float> gm(m * c);
    int zeros = 0;
    for (int64_t i = 0; i < m * c; ++i) {
      EXPECT_EQ(yf[i], std::max(y[i], 0.0f));
      gm[i] = y[i] > 0 ? g[i] : 0.0f;
      zeros += yf[i] == 0.0f;
    }
    EXPECT_GT(zeros, 0);
    std::vector<float> dx(m * c), dg(c), db(c), dxf(m * c), dgf(c), dbf(c);
    ASSERT_TRUE(BatchNormBackwardCpu(plain, x.data(), nullptr, gm.data(), gamma.data(), mean.data(),
                                     inv.data(), dx.data(), dg.data(), db.data(), cws.data())
                    .ok());
    ASSERT_TRUE(BatchNormBackwardCpu(fused, x.data(), yf.data(), g.data(), gamma.data(),
                                     mean.data(), inv.data(), dxf.data(), dgf.data(), dbf.data(),
                                     cws.data())
                    .ok());
    EXPECT_EQ(dx, dxf);
    EXPECT_EQ(dg, dgf);
    EXPECT_EQ(db, dbf);
  }
}

TEST(BatchNorm, EvalUsesRunningStatistics) {
  const int c = 3;
  BatchNormShape sh{5, c};
  std::vector<float> cws(BatchNormWorkspaceFloatsCpu(sh));
  auto x = RandomFloats(5 * c, 9);
  std::vector<float> gamma = {1.0f, 2.0f, 0.5f}, beta = {0.0f, -1.0f, 3.0f};
  std::vector<float> rm = {0.1f, -0.2f, 0.3f}, rv = {1.0f, 4.0f, 0.25f}, y(5 * c);
  BatchNormForwardEvalCpu(sh, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), y.data(),
                          cws.data());
  for (int i = 0; i < 5 * c; ++i) {
    const int j = i % c;
    EXPECT_NEAR(y[i], (x[i] - rm[j]) / std::sqrt(rv[j] + 1e-5) * gamma[j] + beta[j], 1e-5);
  }
}

}  // namespace
}  // namespace topiary::kernels
