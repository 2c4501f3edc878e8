// Tests of the small GEMM-shaped and per-sample kernels: linear, loss, top-k, SGD.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/conv/linear.h"
#include "kernels/elementwise/loss.h"
#include "kernels/elementwise/sgd.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::Dot;
using testing::NumericalGradient;
using testing::RandomFloats;
using testing::RelError;
using testing::ToDouble;

std::vector<double> RefLinear(const LinearShape& sh, const std::vector<double>& x,
                              const std::vector<double>& w, const std::vector<double>& b) {
  std::vector<double> y(sh.n * sh.out);
  for (int i = 0; i < sh.n; ++i)
    for (int o = 0; o < sh.out; ++o) {
      double acc = b[o];
      for (int j = 0; j < sh.in; ++j) acc += x[i * sh.in + j] * w[o * sh.in + j];
      y[i * sh.out + o] = acc;
    }
  return y;
}

TEST(Linear, MatchesReferenceAndFiniteDifferences) {
  for (LinearShape sh : {LinearShape{1, 7, 3}, LinearShape{5, 16, 10}, LinearShape{33, 9, 1}}) {
    auto x = RandomFloats(sh.n * sh.in, 1), w = RandomFloats(sh.out * sh.in, 2);
    auto b = RandomFloats(sh.out, 3), g = RandomFloats(sh.n * sh.out, 4);
    std::vector<float> y(sh.n * sh.out), dx(sh.n * sh.in), dw(sh.out * sh.in), db(sh.out);
    LinearForwardCpu(sh, x.data(), w.data(), b.data(), y.data());
    LinearBackwardDataCpu(sh, g.data(), w.data(), dx.data());
    LinearBackwardFilterCpu(sh, x.data(), g.data(), dw.data(), db.data());
    auto xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b), gd = ToDouble(g);
    EXPECT_LT(RelError(y, RefLinear(sh, xd, wd, bd)), 1e-6);
    EXPECT_LT(
        RelError(
            dx, NumericalGradient(
                    [&](std::vector<double>& v) { return Dot(RefLinear(sh, v, wd, bd), gd); }, xd)),
        1e-6);
    EXPECT_LT(
        RelError(
            dw, NumericalGradient(
                    [&](std::vector<double>& v) { return Dot(RefLinear(sh, xd, v, bd), gd); }, wd)),
        1e-6);
    EXPECT_LT(
        RelError(
            db, NumericalGradient(
                    [&](std::vector<double>& v) { return Dot(RefLinear(sh, xd, wd, v), gd); }, bd)),
        1e-6);
  }
}

double RefLoss(int n, int classes, const std::vector<double>& z, const std::vector<int32_t>& y,
               double eps) {
  double total = 0;
  for (int i = 0; i < n; ++i) {
    double m = -1e300, s = 0;
    for (int j = 0; j < classes; ++j) m = std::max(m, z[i * classes + j]);
    for (int j = 0; j < classes; ++j) s += std::exp(z[i * classes + j] - m);
    for (int j = 0; j < classes; ++j) {
      const double t = (j == y[i] ? 1 - eps : 0) + eps / classes;
      total -= t * (z[i * classes + j] - m - std::log(s));
    }
  }
  return total / n;
}

TEST(SoftmaxCrossEntropy, LossAndGradientWithAndWithoutSmoothing) {
  const int n = 6, classes = 5;
  auto z = RandomFloats(n * classes, 5, -4.0f, 4.0f);
  z[3] = 60.0f;  // a large logit: the log-sum-exp must stay finite
  std::vector<int32_t> y = {0, 4, 2, 2, 1, 3};
  for (float eps : {0.0f, 0.1f}) {
    std::vector<float> d(n * classes);
    const double loss = SoftmaxCrossEntropyCpu(n, classes, z.data(), y.data(), eps, d.data());
    auto zd = ToDouble(z);
    EXPECT_NEAR(loss, RefLoss(n, classes, zd, y, eps), 1e-6);
    auto num = NumericalGradient(
        [&](std::vector<double>& v) { return RefLoss(n, classes, v, y, eps); }, zd, 1e-5);
    EXPECT_LT(RelError(d, num), 1e-5);
  }
}

TEST(TopK, CountsWithTiesTowardLowerIndex) {
  // Rows: label is argmax; label second; all equal (class 0 wins ties); label last of 4.
  std::vector<float> z = {0, 5, 1, 2, 9, 8, 0, 0, 1, 1, 1, 1, 4, 3, 2, 1};
  std::vector<int32_t> y = {1, 1, 2, 3};
  EXPECT_EQ(TopKCorrectCpu(4, 4, z.data(), y.data(), 1), 1);
  EXPECT_EQ(TopKCorrectCpu(4, 4, z.data(), y.data(), 2), 2);
  EXPECT_EQ(TopKCorrectCpu(4, 4, z.data(), y.data(), 3), 3);
  EXPECT_EQ(TopKCorrectCpu(4, 4, z.data(), y.data(), 4), 4);
}

// Several steps compared with a double-precision transcription of PyTorch's SGD.
TEST(Sgd, MatchesPyTorchSemanticsOverSteps) {
  const int n = 50;
  for (bool nesterov : {false, true})
    for (bool decoupled : {false, true}) {
      SgdParams p{0.05f, 0.9f, nesterov, 0.01f, decoupled};
      auto w = RandomFloats(n, 6);
      std::vector<float> buf(n, 0.0f);
      std::vector<double> rw = ToDouble(w), rbuf(n, 0.0);
      for (int step = 0; step < 5; ++step) {
        auto g = RandomFloats(n, 100 + step);
        SgdStepCpu(n, p, g.data(), nullptr, w.data(), buf.data());
        for (int i = 0; i < n; ++i) {
          double gi = g[i] + (decoupled ? 0.0 : p.weight_decay * rw[i]);
          rbuf[i] = p.momentum * rbuf[i] + gi;
          const double d = nesterov ? gi + p.momentum * rbuf[i] : rbuf[i];
          if (decoupled) rw[i] -= p.lr * p.weight_decay * rw[i];
          rw[i] -= p.lr * d;
        }
      }
      EXPECT_LT(RelError(w, rw), 1e-5) << nesterov << decoupled;
    }
}

TEST(Sgd, MaskedWeightsAndMomentumStayExactlyZero) {
  const int n = 64;
  auto w = RandomFloats(n, 7);
  std::vector<float> buf = RandomFloats(n, 8);
  std::vector<uint8_t> mask(n);
  for (int i = 0; i < n; ++i) mask[i] = (i % 3) != 0;
  SgdParams p{0.1f, 0.9f, true, 5e-4f, false};
  for (int step = 0; step < 3; ++step) {
    auto g = RandomFloats(n, 200 + step, -10.0f, 10.0f);
    SgdStepCpu(n, p, g.data(), mask.data(), w.data(), buf.data());
    for (int i = 0; i < n; ++i) {
      if (!mask[i]) {
        EXPECT_EQ(w[i], 0.0f);
        EXPECT_EQ(buf[i], 0.0f);
      } else {
        EXPECT_NE(w[i], 0.0f);
      }
    }
  }
}

}  // namespace
}  // namespace topiary::kernels
