// MeasureCodeUse against a direct sum over every (input element, weight) pair, and the
// behaviour the warning exists for: TFApprox's asymmetric codes put a centred filter's
// products where a near-exact multiplier is far off, sign-magnitude codes do not.
#include "trainer/approx/code_use.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/approx/approx_conv.h"
#include "kernels/test_util.h"
#include "trainer/approx/multiplier.h"

namespace topiary {
namespace {

using kernels::testing::RandomFloats;

ConvApproximation Approx(const Multiplier& m, bool sign_magnitude, bool per_channel) {
  ConvApproximation a;
  a.multiplier = m.name;
  a.weights.code =
      sign_magnitude ? kernels::WeightCode::kSignMagnitude : kernels::WeightCode::kAsymmetric;
  a.weights.scales =
      per_channel ? kernels::WeightScales::kPerChannel : kernels::WeightScales::kPerTensor;
  a.table = sign_magnitude ? kernels::SignMagnitudeTable(m.table) : m.table;
  return a;
}

// sum |T'[a_i, c_j] - a_i c_j| / sum |(a_i - zp_a)(c_j - zp_w(j))| over every input element i
// and weight j, straight from the definition.
double DirectUsedErrorPct(const kernels::ConvShape& s, const std::vector<float>& x,
                          const std::vector<float>& w, const ConvApproximation& a) {
  const auto [xl, xh] = std::minmax_element(x.begin(), x.end());
  const kernels::QuantParams qa = kernels::ChooseQuantParams(*xl, *xh);
  double err = 0, size = 0;
  const int patch = s.patch();
  for (int k = 0; k < s.k; ++k) {
    const bool per_channel = a.weights.scales == kernels::WeightScales::kPerChannel;
    auto first = per_channel ? w.begin() + k * patch : w.begin();
    auto last = per_channel ? first + patch : w.end();
    const auto [wl, wh] = std::minmax_element(first, last);
    const kernels::QuantParams qw = kernels::WeightParams(*wl, *wh, a.weights.code);
    for (int p = 0; p < patch; ++p) {
      const int c = kernels::QuantizeCode(w[k * patch + p], qw);
      for (float v : x) {
        const int code = kernels::QuantizeCode(v, qa);
        err += std::abs(static_cast<double>(a.table[(code << 8) | c]) - code * c);
        size += std::abs(static_cast<double>(code - qa.zero_point) * (c - qw.zero_point));
      }
    }
  }
  return 100.0 * err / size;
}

TEST(CodeUse, EqualsTheDirectSumOverEveryPair) {
  const kernels::ConvShape s = kernels::testing::MakeConv(2, 5, 5, 3, 4, 3, 3, 1, 1);
  const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, 1, -0.5f, 2.0f);
  auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), 2, -0.4f, 0.3f);
  for (int p = 0; p < s.patch(); ++p) w[p] *= 0.05f;  // one small filter row
  for (const char* name : {"drum:4", "mitchell", "trunc:3"}) {
    const auto m = LoadMultiplier(name);
    ASSERT_TRUE(m.ok()) << m.status();
    for (const bool sm : {false, true}) {
      for (const bool per_channel : {false, true}) {
        const ConvApproximation a = Approx(*m, sm, per_channel);
        const CodeUse u = MeasureCodeUse("conv", s, x.data(), w.data(), a, m->table, nullptr);
        EXPECT_NEAR(u.used_error_pct, DirectUsedErrorPct(s, x, w, a),
                    1e-9 * u.used_error_pct + 1e-12)
            << name << " sign-magnitude " << sm << " per channel " << per_channel;
        EXPECT_EQ(u.layer, "conv");
        EXPECT_EQ(u.multiplier, name);
      }
    }
  }
}

TEST(CodeUse, ExactTableHasNoErrorAnywhere) {
  const kernels::ConvShape s = kernels::testing::MakeConv(1, 4, 4, 2, 3, 3, 3, 1, 1);
  const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, 3, 0.0f, 1.0f);
  const auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), 4, -1.0f, 1.0f);
  const auto m = LoadMultiplier("exact");
  ASSERT_TRUE(m.ok());
  for (const bool sm : {false, true}) {
    const CodeUse u =
        MeasureCodeUse("c", s, x.data(), w.data(), Approx(*m, sm, false), m->table, nullptr);
    EXPECT_EQ(u.used_error_pct, 0.0);
    EXPECT_EQ(u.table_error_pct, 0.0);
    EXPECT_FALSE(u.far);
  }
}

// A post-ReLU input and a filter centred on 0, as in a trained ResNet: drum:6 is exact below
// 64 and within a few percent above. Asymmetric codes sit near 128 (errors of a few percent of
// a c) while the products they stand for are small: far. Sign-magnitude magnitudes are small
// enough to be exact: near 0.
TEST(CodeUse, AsymmetricCodesAreFarFromTheTableMetricsAndSignMagnitudeIsNot) {
  const kernels::ConvShape s = kernels::testing::MakeConv(4, 8, 8, 16, 16, 3, 3, 1, 1);
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(s.n) * s.h * s.w * s.c), w(s.k * s.patch());
  for (float& v : x) v = std::max(0.0f, normal(gen));
  for (float& v : w) v = 0.05f * normal(gen);
  const auto m = LoadMultiplier("drum:6");
  ASSERT_TRUE(m.ok());
  const CodeUse asym =
      MeasureCodeUse("c", s, x.data(), w.data(), Approx(*m, false, false), m->table, nullptr);
  const CodeUse sm =
      MeasureCodeUse("c", s, x.data(), w.data(), Approx(*m, true, false), m->table, nullptr);
  EXPECT_EQ(asym.table_error_pct, sm.table_error_pct);
  EXPECT_GT(asym.table_error_pct, 0.1);
  EXPECT_TRUE(asym.far) << asym.used_error_pct << "% used vs " << asym.table_error_pct << "%";
  EXPECT_FALSE(sm.far) << sm.used_error_pct << "% used vs " << sm.table_error_pct << "%";
  EXPECT_LT(sm.used_error_pct, asym.used_error_pct / 5);
}

// A pruned filter in the sign-magnitude mode multiplies to exactly 0, whatever T[a, 0] is:
// no error, even with a random table; the asymmetric mode pays the table's error for each of
// its products (zero point 0 for an all-zero filter: T[a, 0] against 0).
TEST(CodeUse, PrunedFiltersCostNothingInSignMagnitude) {
  const kernels::ConvShape s = kernels::testing::MakeConv(1, 4, 4, 2, 2, 1, 1, 1, 0);
  const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, 6, 0.0f, 1.0f);
  const std::vector<float> w(s.k * s.patch(), 0.0f);
  Multiplier m;
  m.name = "random";
  std::mt19937 gen(7);
  for (int i = 0; i < kernels::kMultiplierEntries; ++i) m.table.push_back(gen() & 0xffff);
  const CodeUse z =
      MeasureCodeUse("c", s, x.data(), w.data(), Approx(m, true, false), m.table, nullptr);
  EXPECT_EQ(z.used_error_pct, 0.0);
  const CodeUse a =
      MeasureCodeUse("c", s, x.data(), w.data(), Approx(m, false, false), m.table, nullptr);
  EXPECT_TRUE(std::isfinite(a.used_error_pct));
  EXPECT_TRUE(a.far);
}

}  // namespace
}  // namespace topiary
