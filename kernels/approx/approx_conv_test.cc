// The approximate convolution against float64 references on random inputs: with the exact
// table it must equal fake quantization followed by the exact convolution; with a random
// table it must equal the float formula of the method, padding positions included.
#include "kernels/approx/approx_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::MakeConv;
using testing::RandomFloats;
using testing::RelError;

std::vector<uint16_t> ExactTable() {
  std::vector<uint16_t> t(kMultiplierEntries);
  for (int a = 0; a < 256; ++a) {
    for (int w = 0; w < 256; ++w) t[(a << 8) | w] = static_cast<uint16_t>(a * w);
  }
  return t;
}

std::vector<uint16_t> RandomTable(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, 65535);
  std::vector<uint16_t> t(kMultiplierEntries);
  for (auto& v : t) v = static_cast<uint16_t>(dist(gen));
  return t;
}

// The forward pass's outputs, and the codes it must have used: those of its own parameters,
// which must be the method's for the inputs' ranges (the whole filter's, or each output
// channel's with per-channel weights).
struct Quantized {
  QuantParams qa;
  std::vector<QuantParams> qw;  // per output channel
  std::vector<uint8_t> a, w;
  std::vector<float> xq, wq, y;
};

Quantized Forward(const ConvShape& s, const std::vector<float>& x, const std::vector<float>& w,
                  const std::vector<uint16_t>& table, const std::vector<float>& bias,
                  const ApproxConvOptions& o = {}) {
  Quantized q;
  q.xq.resize(x.size());
  q.wq.resize(w.size());
  q.y.resize(static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k);
  std::vector<QuantParams> params(ApproxParamCount(s));
  std::vector<unsigned char> workspace(ApproxConvWorkspaceBytesCpu(s));
  ApproxConv2dForwardCpu(s, x.data(), w.data(), bias.data(), table.data(), q.y.data(), q.xq.data(),
                         q.wq.data(), params.data(), workspace.data(), o);
  q.qa = params[0];
  q.qw.assign(params.begin() + 1, params.end());
  const auto [x_lo, x_hi] = std::minmax_element(x.begin(), x.end());
  const QuantParams expected_a = ChooseQuantParams(*x_lo, *x_hi);
  EXPECT_EQ(q.qa.scale, expected_a.scale);
  EXPECT_EQ(q.qa.zero_point, expected_a.zero_point);
  for (size_t i = 0; i < x.size(); ++i) {
    q.a.push_back(QuantizeCode(x[i], q.qa));
    EXPECT_EQ(q.xq[i], DequantizeCode(q.a.back(), q.qa)) << i;
  }
  const int patch = s.patch();
  for (int k = 0; k < s.k; ++k) {
    auto first = w.begin() + (o.weights.scales == WeightScales::kPerChannel ? k * patch : 0);
    auto last = o.weights.scales == WeightScales::kPerChannel ? first + patch : w.end();
    const auto [lo, hi] = std::minmax_element(first, last);
    const QuantParams expected = WeightParams(*lo, *hi, o.weights.code);
    EXPECT_EQ(q.qw[k].scale, expected.scale) << "channel " << k;
    EXPECT_EQ(q.qw[k].zero_point, expected.zero_point) << "channel " << k;
    for (int p = 0; p < patch; ++p) {
      q.w.push_back(QuantizeCode(w[k * patch + p], q.qw[k]));
      EXPECT_EQ(q.wq[k * patch + p], DequantizeCode(q.w.back(), q.qw[k])) << k << " " << p;
    }
  }
  return q;
}

// y = s_a s_w sum T[a_p, w_p] + o_w sum xq_p + o_a sum wq_p - P o_a o_w + bias in float64,
// straight from the method's definition (offset o = -zp * scale; padding: code zp_a, xq 0).
std::vector<double> FormulaReference(const ConvShape& s, const Quantized& q,
                                     const std::vector<uint16_t>& table,
                                     const std::vector<float>& bias) {
  const double sa = q.qa.scale, oa = -q.qa.zero_point * sa;
  const int ho = s.ho(), wo = s.wo(), patch = s.patch();
  std::vector<double> y(static_cast<size_t>(s.n) * ho * wo * s.k);
  for (int n = 0; n < s.n; ++n)
    for (int oh = 0; oh < ho; ++oh)
      for (int ow_ = 0; ow_ < wo; ++ow_)
        for (int k = 0; k < s.k; ++k) {
          const double sw = q.qw[k].scale, ow = -q.qw[k].zero_point * sw;
          double t_sum = 0, x_sum = 0, w_sum = 0;
          for (int r = 0; r < s.r; ++r)
            for (int c2 = 0; c2 < s.s; ++c2)
              for (int c = 0; c < s.c; ++c) {
                const int ih = oh * s.stride_h - s.pad_h + r, iw = ow_ * s.stride_w - s.pad_w + c2;
                const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
                const size_t xi = ((static_cast<size_t>(n) * s.h + ih) * s.w + iw) * s.c + c;
                const size_t wi = ((static_cast<size_t>(k) * s.r + r) * s.s + c2) * s.c + c;
                const int a = inside ? q.a[xi] : q.qa.zero_point;
                t_sum += table[(a << 8) | q.w[wi]];
                x_sum += inside ? q.xq[xi] : 0.0;
                w_sum += q.wq[wi];
              }
          y[((static_cast<size_t>(n) * ho + oh) * wo + ow_) * s.k + k] =
              sa * sw * t_sum + ow * x_sum + oa * w_sum - patch * oa * ow + bias[k];
        }
  return y;
}

// The exact convolution of the fake-quantized operands, in float64.
std::vector<double> FakeQuantConvReference(const ConvShape& s, const Quantized& q,
                                           const std::vector<float>& bias) {
  const int ho = s.ho(), wo = s.wo();
  std::vector<double> y(static_cast<size_t>(s.n) * ho * wo * s.k);
  for (int n = 0; n < s.n; ++n)
    for (int oh = 0; oh < ho; ++oh)
      for (int ow = 0; ow < wo; ++ow)
        for (int k = 0; k < s.k; ++k) {
          double acc = bias[k];
          for (int r = 0; r < s.r; ++r)
            for (int c2 = 0; c2 < s.s; ++c2) {
              const int ih = oh * s.stride_h - s.pad_h + r, iw = ow * s.stride_w - s.pad_w + c2;
              if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
              for (int c = 0; c < s.c; ++c) {
                acc += static_cast<double>(
                           q.xq[((static_cast<size_t>(n) * s.h + ih) * s.w + iw) * s.c + c]) *
                       q.wq[((static_cast<size_t>(k) * s.r + r) * s.s + c2) * s.c + c];
              }
            }
          y[((static_cast<size_t>(n) * ho + oh) * wo + ow) * s.k + k] = acc;
        }
  return y;
}

struct Case {
  const char* what;
  ConvShape shape;
};

// The awkward shapes: odd sizes, stride 2, 1x1, batch 1, a filter covering the whole input,
// more padding than a ResNet uses, a single channel.
std::vector<Case> Cases() {
  return {
      {"3x3 pad 1", MakeConv(2, 7, 7, 5, 6, 3, 3, 1, 1)},
      {"3x3 stride 2 odd", MakeConv(3, 9, 11, 3, 7, 3, 3, 2, 1)},
      {"1x1", MakeConv(2, 5, 5, 8, 4, 1, 1, 1, 0)},
      {"1x1 stride 2", MakeConv(1, 6, 6, 3, 5, 1, 1, 2, 0)},
      {"batch 1 5x5 pad 2", MakeConv(1, 8, 8, 3, 4, 5, 5, 1, 2)},
      {"filter covers input", MakeConv(2, 4, 4, 3, 5, 4, 4, 1, 0)},
      {"filter covers padded input", MakeConv(2, 3, 3, 2, 3, 5, 5, 1, 1)},
      {"1 channel 7x3", MakeConv(2, 10, 6, 1, 3, 7, 3, 1, 3)},
  };
}

TEST(ApproxConv, ExactTableEqualsFakeQuantizedExactConv) {
  const auto table = ExactTable();
  uint32_t seed = 1;
  for (const Case& c : Cases()) {
    const ConvShape& s = c.shape;
    const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, seed++, -1.5f, 2.0f);
    const auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), seed++, -0.7f, 0.4f);
    const auto bias = RandomFloats(s.k, seed++);
    for (const bool per_channel : {false, true}) {
      ApproxConvOptions o;
      o.weights.scales = per_channel ? WeightScales::kPerChannel : WeightScales::kPerTensor;
      const Quantized q = Forward(s, x, w, table, bias, o);
      EXPECT_LE(RelError(q.y, FakeQuantConvReference(s, q, bias)), 1e-5)
          << c.what << (per_channel ? ", per channel" : "");
    }
  }
}

TEST(ApproxConv, RandomTableEqualsTheFormulaWithPaddingThroughTheTable) {
  uint32_t seed = 100;
  for (const Case& c : Cases()) {
    const ConvShape& s = c.shape;
    const auto table = RandomTable(seed++);
    const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, seed++, -1.0f, 3.0f);
    const auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), seed++, -0.5f, 0.5f);
    const auto bias = RandomFloats(s.k, seed++);
    for (const bool per_channel : {false, true}) {
      ApproxConvOptions o;
      o.weights.scales = per_channel ? WeightScales::kPerChannel : WeightScales::kPerTensor;
      const Quantized q = Forward(s, x, w, table, bias, o);
      EXPECT_LE(RelError(q.y, FormulaReference(s, q, table, bias)), 1e-5)
          << c.what << (per_channel ? ", per channel" : "");
    }
  }
}

// The sign-magnitude mode: symmetric weight codes (zero point 128, scale max|w| / 127) and
// the derived table. With the exact table it is symmetric fake quantization followed by the
// exact convolution; with any table, a weight of 0 contributes exactly nothing.
Quantized SignMagnitudeForward(const ConvShape& s, const std::vector<float>& x,
                               const std::vector<float>& w, const std::vector<uint16_t>& multiplier,
                               const std::vector<float>& bias, bool per_channel = false) {
  ApproxConvOptions o;
  o.weights.code = true ? WeightCode::kSignMagnitude : WeightCode::kAsymmetric;
  o.weights.scales = per_channel ? WeightScales::kPerChannel : WeightScales::kPerTensor;
  return Forward(s, x, w, SignMagnitudeTable(multiplier), bias, o);
}

TEST(ApproxConv, SignMagnitudeWithTheExactTableIsSymmetricFakeQuantization) {
  EXPECT_EQ(SignMagnitudeTable(ExactTable()), ExactTable());  // a c = 128 a + a (c - 128)
  uint32_t seed = 300;
  for (const Case& c : Cases()) {
    const ConvShape& s = c.shape;
    const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, seed++, 0.0f, 2.0f);
    const auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), seed++, -0.7f, 0.4f);
    const auto bias = RandomFloats(s.k, seed++);
    for (const bool per_channel : {false, true}) {
      const Quantized q = SignMagnitudeForward(s, x, w, ExactTable(), bias, per_channel);
      // Post-ReLU activations: zero point 0. Weights: symmetric, 0 at code 128, and Forward
      // checked each channel's scale max|w| / 127 over its range.
      EXPECT_EQ(q.qa.zero_point, 0) << c.what;
      for (const QuantParams& qw : q.qw) EXPECT_EQ(qw.zero_point, 128) << c.what;
      if (!per_channel) {
        const float m = std::max(std::fabs(*std::min_element(w.begin(), w.end())),
                                 std::fabs(*std::max_element(w.begin(), w.end())));
        EXPECT_EQ(q.qw[0].scale, m / 127.0f) << c.what;
      }
      EXPECT_LE(RelError(q.y, FakeQuantConvReference(s, q, bias)), 1e-5)
          << c.what << (per_channel ? ", per channel" : "");
    }
  }
}

TEST(ApproxConv, SignMagnitudeZeroWeightsContributeNothingWhateverTheTable) {
  const ConvShape s = MakeConv(2, 7, 7, 5, 6, 3, 3, 1, 1);
  auto table = RandomTable(7);  // T[a, 0] far from 0
  const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, 8, 0.0f, 2.0f);
  auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), 9, -0.5f, 0.5f);
  // Filter 0 pruned entirely, filter 1 half pruned; the rest as drawn.
  for (int p = 0; p < s.patch(); ++p) {
    w[p] = 0.0f;
    if (p % 2 == 0) w[s.patch() + p] = 0.0f;
  }
  const auto bias = RandomFloats(s.k, 10);
  // Half pruned: equal to the same filter with the pruned taps' table entries changed.
  std::vector<uint16_t> other = table;
  for (int a = 0; a < 256; ++a) other[a << 8] = static_cast<uint16_t>(a * 3 + 1);
  for (const bool per_channel : {false, true}) {
    const auto y = SignMagnitudeForward(s, x, w, table, bias, per_channel).y;
    for (int64_t pix = 0; pix < static_cast<int64_t>(s.n) * s.ho() * s.wo(); ++pix) {
      ASSERT_EQ(y[pix * s.k], bias[0]) << "a pruned filter gives exactly its bias, at " << pix;
    }
    const auto y2 = SignMagnitudeForward(s, x, w, other, bias, per_channel).y;
    for (int64_t pix = 0; pix < static_cast<int64_t>(s.n) * s.ho() * s.wo(); ++pix) {
      ASSERT_EQ(y[pix * s.k + 1], y2[pix * s.k + 1]) << pix;
    }
  }
}

// Why per-channel scales exist: a filter row far smaller than the rest keeps its resolution.
// With one channel at 1/100 of the others, per-tensor codes leave it a few levels; its own
// range gives it 255 (asymmetric) or 127 (sign-magnitude) again.
TEST(ApproxConv, PerChannelScalesKeepSmallFiltersResolved) {
  const ConvShape s = MakeConv(2, 6, 6, 4, 5, 3, 3, 1, 1);
  const auto x = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, 40, 0.0f, 1.0f);
  auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), 41, -1.0f, 1.0f);
  for (int p = 0; p < s.patch(); ++p) w[p] *= 0.01f;  // channel 0
  const std::vector<float> bias(s.k, 0.0f);
  for (const bool symmetric : {false, true}) {
    double err[2];
    for (const bool per_channel : {false, true}) {
      ApproxConvOptions o;
      o.weights.code = symmetric ? WeightCode::kSignMagnitude : WeightCode::kAsymmetric;
      o.weights.scales = per_channel ? WeightScales::kPerChannel : WeightScales::kPerTensor;
      const Quantized q =
          Forward(s, x, w, symmetric ? SignMagnitudeTable(ExactTable()) : ExactTable(), bias, o);
      double e = 0, m = 0;
      for (int p = 0; p < s.patch(); ++p) {
        e = std::max(e, static_cast<double>(std::fabs(q.wq[p] - w[p])));
        m = std::max(m, static_cast<double>(std::fabs(w[p])));
      }
      err[per_channel] = e / m;
    }
    EXPECT_GT(err[0], 0.1) << "per tensor, channel 0 has a few codes (symmetric " << symmetric
                           << ")";
    EXPECT_LT(err[1], 0.01) << "per channel, its own range (symmetric " << symmetric << ")";
  }
}

TEST(ApproxConv, ConstantTensorsAndAllPositiveRanges) {
  const auto table = ExactTable();
  const ConvShape s = MakeConv(2, 5, 5, 3, 4, 3, 3, 1, 1);
  const std::vector<float> bias(s.k, 0.25f);
  for (float xv : {0.0f, 0.7f, -1.3f}) {
    for (float wv : {0.0f, 0.2f, -0.4f}) {
      const std::vector<float> x(static_cast<size_t>(s.n) * s.h * s.w * s.c, xv);
      const std::vector<float> w(static_cast<size_t>(s.k) * s.patch(), wv);
      const Quantized q = Forward(s, x, w, table, bias);
      EXPECT_FLOAT_EQ(q.xq[0], xv);
      EXPECT_FLOAT_EQ(q.wq[0], wv);
      EXPECT_LE(RelError(q.y, FakeQuantConvReference(s, q, bias)), 1e-5)
          << "x = " << xv << ", w = " << wv;
    }
  }
}

TEST(ApproxConv, QuantizationNudgesZeroOntoACode) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  for (int i = 0; i < 2000; ++i) {
    float lo = d(gen), hi = d(gen);
    if (lo > hi) std::swap(lo, hi);
    const QuantParams q = ChooseQuantParams(lo, hi);
    ASSERT_GE(q.zero_point, 0);
    ASSERT_LE(q.zero_point, 255);
    EXPECT_EQ(DequantizeCode(QuantizeCode(0.0f, q), q), 0.0f) << lo << " " << hi;
    if (lo <= 0.0f && hi >= 0.0f) {
      // Inside a range that holds 0, codes are within half a step of the value.
      const float x = lo + (hi - lo) * (i % 97) / 96.0f;
      EXPECT_LE(std::abs(DequantizeCode(QuantizeCode(x, q), q) - x), 0.5f * q.scale * 1.001f);
    }
  }
  // The values TensorFlow's FakeQuantWithMinMaxArgs gives for [-1, 2]: scale 3/255, zero
  // point round(255/3) = 85.
  const QuantParams q = ChooseQuantParams(-1.0f, 2.0f);
  EXPECT_FLOAT_EQ(q.scale, 3.0f / 255.0f);
  EXPECT_EQ(q.zero_point, 85);
  EXPECT_EQ(QuantizeCode(-5.0f, q), 0);
  EXPECT_EQ(QuantizeCode(5.0f, q), 255);
  EXPECT_EQ(QuantizeCode(std::nanf(""), q), 0);
}

TEST(ApproxConv, MovingAverageRangeStartsAtTheFirstBatchAndThenFollowsIt) {
  const ConvShape s = MakeConv(2, 5, 5, 3, 4, 3, 3, 1, 1);
  const auto w = RandomFloats(static_cast<size_t>(s.k) * s.patch(), 31, -0.5f, 0.5f);
  const auto x1 = RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, 32, -1.0f, 2.0f);
  std::vector<float> x2 = x1;
  for (float& v : x2) v *= 3.0f;
  const auto [lo1, hi1] = std::minmax_element(x1.begin(), x1.end());
  const std::vector<uint16_t> table = RandomTable(33);
  const std::vector<float> bias(s.k, 0.0f);
  std::vector<float> y(static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k), y_batch(y.size());
  std::vector<float> xq(x1.size()), wq(w.size());
  std::vector<unsigned char> ws(ApproxConvWorkspaceBytesCpu(s));
  std::vector<QuantParams> params(ApproxParamCount(s));
  auto run = [&](const std::vector<float>& x, float* running, bool update, float* out) {
    ApproxConvOptions o;
    o.running_range = running;
    o.update_range = update;
    ApproxConv2dForwardCpu(s, x.data(), w.data(), bias.data(), table.data(), out, xq.data(),
                           wq.data(), params.data(), ws.data(), o);
  };
  float running[3] = {0, 0, 0};
  // Unobserved and not updated: the batch's own range, running untouched.
  run(x1, running, false, y.data());
  run(x1, nullptr, false, y_batch.data());
  EXPECT_EQ(y, y_batch);
  EXPECT_EQ(running[2], 0.0f);
  // The first update takes the batch's range as is: the same output as the per-batch mode.
  run(x1, running, true, y.data());
  EXPECT_EQ(running[0], *lo1);
  EXPECT_EQ(running[1], *hi1);
  EXPECT_EQ(running[2], 1.0f);
  EXPECT_EQ(y, y_batch);
  // A batch three times as wide moves the range by 1% of the difference, and is quantized
  // with the running range: its extremes clamp to the end codes.
  run(x2, running, true, y.data());
  EXPECT_FLOAT_EQ(running[0], *lo1 + kRangeMomentum * (3.0f * *lo1 - *lo1));
  EXPECT_FLOAT_EQ(running[1], *hi1 + kRangeMomentum * (3.0f * *hi1 - *hi1));
  const QuantParams expected = ChooseQuantParams(running[0], running[1]);
  EXPECT_EQ(params[0].scale, expected.scale);
  EXPECT_EQ(params[0].zero_point, expected.zero_point);
  EXPECT_EQ(*std::max_element(xq.begin(), xq.end()), DequantizeCode(255, expected));
  EXPECT_EQ(*std::min_element(xq.begin(), xq.end()), DequantizeCode(0, expected));
  // Evaluation (no update) reads the range and leaves it alone.
  const std::vector<float> before(running, running + 3);
  run(x2, running, false, y.data());
  EXPECT_EQ(std::vector<float>(running, running + 3), before);
}

TEST(ApproxConv, RefusesPatchesThatCouldOverflow) {
  EXPECT_TRUE(CheckApproxConvShape(MakeConv(1, 8, 8, 3640, 1, 3, 3, 1, 1)).ok());
  const absl::Status st = CheckApproxConvShape(MakeConv(1, 8, 8, 4096, 1, 3, 3, 1, 1));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("36864"), absl::string_view::npos) << st;
}

}  // namespace
}  // namespace topiary::kernels
