// The activations and the gating product against float64 references, and their backward
// passes against central differences of the float64 forward.
#include "kernels/elementwise/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

namespace topiary::kernels {
namespace {

double Reference(const ActivationFn& p, double x) {
  switch (p.kind) {
    case ActivationKind::kSigmoid:
      return 1 / (1 + std::exp(-x));
    case ActivationKind::kSilu:
      return x / (1 + std::exp(-x));
    case ActivationKind::kLeakyRelu:
      return x > 0 ? x : p.alpha * x;
    case ActivationKind::kHardSigmoid:
      return std::min(std::max(p.alpha * x + p.beta, 0.0), 1.0);
    case ActivationKind::kHardSwish:
      return x * std::min(std::max(x / 6 + 0.5, 0.0), 1.0);
  }
  return 0;
}

std::vector<float> Inputs(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-8, 8);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  // The kinks and ends, where the slope's side matters, and values far out.
  for (float v : {0.0f, -3.0f, 3.0f, -2.5f, 2.5f, 40.0f, -40.0f, 1e-30f}) x.push_back(v);
  return x;
}

TEST(Activation, ForwardAndBackwardMatchFloat64) {
  const ActivationFn kinds[] = {{ActivationKind::kSigmoid},
                                {ActivationKind::kSilu},
                                {ActivationKind::kLeakyRelu, 0.1f},
                                {ActivationKind::kHardSigmoid, 0.2f, 0.5f},
                                {ActivationKind::kHardSigmoid, 1.0f / 6, 0.5f},
                                {ActivationKind::kHardSwish}};
  for (const ActivationFn& p : kinds) {
    SCOPED_TRACE(static_cast<int>(p.kind));
    const std::vector<float> x = Inputs(1001, 3);
    const int n = static_cast<int>(x.size());
    std::vector<float> y(n), dy(n), dx(n);
    std::mt19937 rng(5);
    std::normal_distribution<float> g;
    for (float& v : dy) v = g(rng);
    ActivationForwardCpu(p, n, x.data(), y.data());
    ActivationBackwardCpu(p, n, x.data(), dy.data(), dx.data());
    for (int i = 0; i < n; ++i) {
      const double ref = Reference(p, x[i]);
      EXPECT_NEAR(y[i], ref, 2e-7 * std::max(1.0, std::abs(ref))) << "x = " << x[i];
      // The slope by central differences, away from the kinks (PyTorch's side is checked
      // below).
      const double h = 1e-4;
      const double slope = (Reference(p, x[i] + h) - Reference(p, x[i] - h)) / (2 * h);
      bool kink = std::abs(x[i]) < 2 * h;
      if (p.kind == ActivationKind::kHardSwish) kink |= std::abs(std::abs(x[i]) - 3) < 2 * h;
      if (p.kind == ActivationKind::kHardSigmoid) {
        const double v = p.alpha * x[i] + p.beta;
        kink = std::abs(v) < 2 * h || std::abs(v - 1) < 2 * h;
      }
      if (!kink) {
        EXPECT_NEAR(dx[i], dy[i] * slope, 1e-5 * std::max(1.0, std::abs(dy[i] * slope)))
            << "x = " << x[i];
      }
    }
  }
  // PyTorch's slopes at the kinks: leaky ReLU's at 0 is alpha; hard swish's at -3 is -0.5 and
  // at +3 is 1.5 (its x / 3 + 1/2 on the closed interval); hard sigmoid's at either end is 0.
  float dx = 0, one = 1, at = 0;
  ActivationBackwardCpu({ActivationKind::kLeakyRelu, 0.1f}, 1, &at, &one, &dx);
  EXPECT_FLOAT_EQ(dx, 0.1f);
  at = -3;
  ActivationBackwardCpu({ActivationKind::kHardSwish}, 1, &at, &one, &dx);
  EXPECT_EQ(dx, -0.5f);
  at = 3;
  ActivationBackwardCpu({ActivationKind::kHardSwish}, 1, &at, &one, &dx);
  EXPECT_EQ(dx, 1.5f);
  at = 3;  // 1/6 * 3 + 1/2 = 1: the upper end
  ActivationBackwardCpu({ActivationKind::kHardSigmoid, 1.0f / 6, 0.5f}, 1, &at, &one, &dx);
  EXPECT_EQ(dx, 0.0f);
}

// The product, same-shape and broadcast per (image, channel), batch 1 and odd sizes, against
// double sums; db of the broadcast form is the sum over the image's pixels.
TEST(Mul, SameShapeAndChannelScaleMatchFloat64) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  for (const auto& [images, pixels, c] :
       {std::tuple{1, 1, 1}, std::tuple{3, 49, 13}, std::tuple{2, 5, 96}, std::tuple{1, 121, 7}}) {
    SCOPED_TRACE(::testing::Message() << images << " x " << pixels << " x " << c);
    const int64_t rows = int64_t{images} * pixels;
    for (int ppi : {0, pixels}) {
      const int64_t nb = ppi == 0 ? rows * c : int64_t{images} * c;
      std::vector<float> a(rows * c), b(nb), dy(rows * c), y(rows * c), da(rows * c), db(nb);
      for (float& v : a) v = g(rng);
      for (float& v : b) v = g(rng);
      for (float& v : dy) v = g(rng);
      MulForwardCpu(rows, c, ppi, a.data(), b.data(), y.data());
      MulBackwardCpu(rows, c, ppi, a.data(), b.data(), dy.data(), da.data(), db.data());
      std::vector<double> rdb(nb, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        for (int j = 0; j < c; ++j) {
          const int64_t i = r * c + j, k = ppi == 0 ? i : (r / ppi) * c + j;
          EXPECT_FLOAT_EQ(y[i], static_cast<double>(a[i]) * b[k]);
          EXPECT_FLOAT_EQ(da[i], static_cast<double>(dy[i]) * b[k]);
          rdb[k] += static_cast<double>(dy[i]) * a[i];
        }
      }
      for (int64_t k = 0; k < nb; ++k) EXPECT_NEAR(db[k], rdb[k], 1e-6 * (1 + std::abs(rdb[k])));
      // A null gradient is left out.
      MulBackwardCpu(rows, c, ppi, a.data(), b.data(), dy.data(), nullptr, db.data());
      MulBackwardCpu(rows, c, ppi, a.data(), b.data(), dy.data(), da.data(), nullptr);
    }
  }
}

}  // namespace
}  // namespace topiary::kernels
