// The approximate conv engine inside a Conv2d layer (CPU): the forward pass is the table
// convolution, the backward pass the exact gradients at the fake-quantized operands, masks
// reach the table as the weight zero point, and the moving-average range is state of the
// layer that training moves and evaluation reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/approx/approx_conv.h"
#include "kernels/conv/sampled_grad.h"
#include "kernels/test_util.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/masks.h"

namespace topiary {
namespace {

using kernels::ConvShape;

std::vector<uint16_t> ExactTable() {
  std::vector<uint16_t> t(kernels::kMultiplierEntries);
  for (int i = 0; i < kernels::kMultiplierEntries; ++i) t[i] = (i >> 8) * (i & 255);
  return t;
}

// One conv layer planned for `batch` images, with its buffers.
struct Harness {
  std::unique_ptr<Device> device = MakeCpuDevice(1);
  Conv2d conv;
  Shape4 in;
  int batch;
  LayerResources res;
  std::vector<float> x, y, dy, dx, scratch;
  std::vector<unsigned char> workspace;

  Harness(Shape4 input, Conv2d::Config config, int n)
      : conv("block.conv", config), in(input), batch(n) {}

  void Setup(uint32_t seed) {
    auto out = conv.Setup({in}, device.get());
    ASSERT_TRUE(out.ok()) << out.status();
    Philox rng(seed, RngStream::kInit);
    conv.Initialize(rng);
    x = kernels::testing::RandomFloats(static_cast<size_t>(batch) * in.per_image(), seed + 1, -1.0f,
                                       2.0f);
    y.resize(static_cast<size_t>(batch) * out->per_image());
    dy = kernels::testing::RandomFloats(y.size(), seed + 2);
    dx.resize(x.size());
  }
  void Plan() {
    auto r = conv.Prepare(batch, device.get(), PlanOptions{});
    ASSERT_TRUE(r.ok()) << r.status();
    res = std::move(*r);
    scratch.assign(res.scratch_floats, 0.0f);
    workspace.assign(res.workspace_bytes, 0);
  }
  LayerIo Io() {
    LayerIo io;
    io.batch = batch;
    io.x = {x.data()};
    io.y = y.data();
    io.dx = {dx.data()};
    io.dy = dy.data();
    io.scratch = scratch.data();
    io.workspace = workspace.data();
    io.state = res.state.get();
    return io;
  }
};

ConvApproximation Approx(std::vector<uint16_t> table, bool moving_average = false) {
  ConvApproximation a;
  a.multiplier = "test";
  a.sha256 = "00";
  a.range = moving_average ? ConvApproximation::Range::kMovingAverage
                           : ConvApproximation::Range::kPerBatch;
  a.table = std::move(table);
  return a;
}

std::vector<float> FakeQuantized(const std::vector<float>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const kernels::QuantParams q = kernels::ChooseQuantParams(*lo, *hi);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = kernels::DequantizeCode(kernels::QuantizeCode(v[i], q), q);
  }
  return out;
}

// Shapes with odd sizes, stride 2, 1x1, batch 1, bias, and a filter covering the input.
struct Case {
  Shape4 in;
  Conv2d::Config config;
  int batch;
};
const Case kCases[] = {
    {{1, 7, 7, 3}, {5, 3, 3, 1, 1, false}, 2},
    {{1, 9, 8, 4}, {6, 3, 3, 2, 1, true}, 3},
    {{1, 5, 5, 7}, {3, 1, 1, 1, 0, false}, 1},
    {{1, 4, 4, 2}, {4, 4, 4, 1, 0, true}, 2},
};

TEST(ApproxConvEngine, ForwardWithTheExactTableIsTheExactConvOfFakeQuantizedOperands) {
  uint32_t seed = 10;
  for (const Case& c : kCases) {
    Harness approx(c.in, c.config, c.batch), exact(c.in, c.config, c.batch);
    approx.Setup(seed);
    exact.Setup(seed);
    seed += 10;
    ASSERT_TRUE(approx.conv.Approximate(Approx(ExactTable()), approx.device.get()).ok());
    approx.Plan();
    // The exact layer gets the fake-quantized filter and input.
    const std::vector<float> wq = FakeQuantized(approx.conv.kernel()->value.ToHost());
    exact.conv.kernel()->value.CopyFromHost(wq.data());
    exact.x = FakeQuantized(approx.x);
    exact.Plan();
    ASSERT_TRUE(approx.conv.Forward(approx.Io(), true).ok());
    ASSERT_TRUE(exact.conv.Forward(exact.Io(), true).ok());
    EXPECT_LE(kernels::testing::RelError(approx.y, kernels::testing::ToDouble(exact.y)), 1e-5);

    // Straight-through backward pass: the exact layer's gradients at those operands, bit for
    // bit (the same kernels on the same numbers).
    ASSERT_TRUE(approx.conv.Backward(approx.Io()).ok());
    ASSERT_TRUE(exact.conv.Backward(exact.Io()).ok());
    EXPECT_EQ(approx.dx, exact.dx);
    EXPECT_EQ(approx.conv.kernel()->grad.ToHost(), exact.conv.kernel()->grad.ToHost());
    const auto params = approx.conv.parameters();
    EXPECT_EQ(params.size(), c.config.bias ? 2u : 1u);  // per batch: no range parameter
  }
}

TEST(ApproxConvEngine, PrunedWeightsReachTheTableAsTheWeightZeroPoint) {
  // A table that is exact except in the weight zero point's column, where it adds 1000: a
  // pruned weight is exactly 0, so its code is zp_w, and each one in a patch adds
  // 1000 * s_a * s_w to the output where an exact table adds nothing.
  Harness h({1, 5, 5, 4}, {3, 3, 3, 1, 1, false}, 1);
  h.Setup(70);
  std::vector<float> w = h.conv.kernel()->value.ToHost();
  for (size_t i = 0; i < w.size(); i += 3) w[i] = 0.0f;  // "pruned"
  h.conv.kernel()->value.CopyFromHost(w.data());
  const auto [lo, hi] = std::minmax_element(w.begin(), w.end());
  const int zp_w = kernels::ChooseQuantParams(*lo, *hi).zero_point;
  std::vector<uint16_t> table = ExactTable();
  for (int a = 0; a < 256; ++a) table[(a << 8) | zp_w] = static_cast<uint16_t>(a * zp_w + 1000);
  ASSERT_TRUE(h.conv.Approximate(Approx(table), h.device.get()).ok());
  h.Plan();
  ASSERT_TRUE(h.conv.Forward(h.Io(), true).ok());
  const std::vector<float> y_biased = h.y;

  Harness e({1, 5, 5, 4}, {3, 3, 3, 1, 1, false}, 1);
  e.Setup(70);
  e.conv.kernel()->value.CopyFromHost(w.data());
  ASSERT_TRUE(e.conv.Approximate(Approx(ExactTable()), e.device.get()).ok());
  e.Plan();
  ASSERT_TRUE(e.conv.Forward(e.Io(), true).ok());
  // Output (0, 0, 0, k = 0): every tap of filter 0 whose code is the zero point (the pruned
  // ones, and any weight that rounds to 0) goes through the changed column, padding included.
  const std::vector<float> wq = FakeQuantized(w);
  int pruned_taps = 0;
  for (int p = 0; p < 3 * 3 * 4; ++p) pruned_taps += wq[p] == 0.0f;
  const auto [xlo, xhi] = std::minmax_element(h.x.begin(), h.x.end());
  const float sa = kernels::ChooseQuantParams(*xlo, *xhi).scale;
  const float sw = kernels::ChooseQuantParams(*lo, *hi).scale;
  EXPECT_NEAR(y_biased[0] - e.y[0], 1000.0 * pruned_taps * sa * sw, 1e-3 * std::abs(y_biased[0]));
  EXPECT_GT(pruned_taps, 0);
}

TEST(ApproxConvEngine, MovingAverageRangeIsLayerStateThatOnlyTrainingMoves) {
  Harness h({1, 6, 6, 3}, {4, 3, 3, 1, 1, false}, 2);
  h.Setup(90);
  ASSERT_TRUE(h.conv.Approximate(Approx(ExactTable(), true), h.device.get()).ok());
  const auto params = h.conv.parameters();
  ASSERT_EQ(params.size(), 2u);
  Parameter* range = params[1];
  EXPECT_EQ(range->role, ParamRole::kActivationRange);
  EXPECT_FALSE(range->trainable);
  EXPECT_EQ(range->full_name(), "block.conv.activation_range");
  EXPECT_EQ(range->value.ToHost(), (std::vector<float>{0, 0, 0}));
  h.Plan();
  ASSERT_TRUE(h.conv.Forward(h.Io(), false).ok());  // evaluation: unobserved stays so
  EXPECT_EQ(range->value.ToHost()[2], 0.0f);
  ASSERT_TRUE(h.conv.Forward(h.Io(), true).ok());
  const auto [lo, hi] = std::minmax_element(h.x.begin(), h.x.end());
  EXPECT_EQ(range->value.ToHost(), (std::vector<float>{*lo, *hi, 1.0f}));
  EXPECT_FALSE(h.conv.Approximate(Approx(ExactTable()), h.device.get()).ok());  // once only
}

TEST(ApproxConvEngine, RefusesTablesOfTheWrongSizeAndPatchesThatCouldOverflow) {
  Harness h({1, 4, 4, 3}, {2, 3, 3, 1, 1, false}, 1);
  h.Setup(5);
  const absl::Status st = h.conv.Approximate(Approx(std::vector<uint16_t>(100)), h.device.get());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("65536"), absl::string_view::npos) << st;
  EXPECT_EQ(h.conv.approximation(), nullptr);

  Harness big({1, 4, 4, 4000}, {2, 3, 3, 1, 1, false}, 1);
  big.Setup(6);
  const absl::Status st2 = big.conv.Approximate(Approx(ExactTable()), big.device.get());
  EXPECT_EQ(st2.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st2.message().find("block.conv"), absl::string_view::npos) << st2;
}

// Sampled weight gradients through the engines' backward pass: the kernel's result on the
// operands the engine differentiates at (the fake-quantized ones when approximate), the exact
// input gradient, masked entries zero, and exact steps while sampling is off.
std::vector<float> SampledReference(const Harness& h, const std::vector<float>& x, int top_k,
                                    float scale, const uint8_t* mask) {
  const ConvShape s = h.conv.ShapeFor(h.batch);
  std::vector<float> dw(h.conv.kernel()->size());
  std::vector<float> dbias(s.k);
  std::vector<unsigned char> ws(kernels::SampledWeightGradWorkspaceBytesCpu(s, top_k));
  kernels::SampledWeightGradCpu(s, kernels::WeightGradSampling{top_k, scale}, x.data(), h.dy.data(),
                                mask, dw.data(), dbias.data(), ws.data());
  return dw;
}

TEST(SampledConvEngine, BackwardSamplesTheFilterGradientOnlyWhileOn) {
  uint32_t seed = 200;
  for (const Case& c : kCases) {
    for (bool approximate : {false, true}) {
      Harness h(c.in, c.config, c.batch), exact(c.in, c.config, c.batch);
      h.Setup(seed);
      exact.Setup(seed);
      seed += 10;
      ASSERT_TRUE(
          h.conv.SampleWeightGradients(GradientSampling{2, GradientSampling::Scale::kReference})
              .ok());
      if (approximate) {
        ASSERT_TRUE(h.conv.Approximate(Approx(ExactTable()), h.device.get()).ok());
        ASSERT_TRUE(exact.conv.Approximate(Approx(ExactTable()), exact.device.get()).ok());
      }
      h.Plan();
      exact.Plan();
      ASSERT_TRUE(h.conv.Forward(h.Io(), true).ok());
      ASSERT_TRUE(exact.conv.Forward(exact.Io(), true).ok());
      // Off: the exact gradients, bit for bit.
      ASSERT_TRUE(h.conv.Backward(h.Io()).ok());
      ASSERT_TRUE(exact.conv.Backward(exact.Io()).ok());
      EXPECT_EQ(h.conv.kernel()->grad.ToHost(), exact.conv.kernel()->grad.ToHost());
      // On: the sampled filter gradient at the engine's operands, the same input gradient.
      h.conv.SetSampling(true);
      ASSERT_TRUE(h.conv.Backward(h.Io()).ok());
      EXPECT_EQ(h.dx, exact.dx);
      const std::vector<float> x = approximate ? FakeQuantized(h.x) : h.x;
      const auto want = SampledReference(h, x, 2, 1.0f / c.batch, nullptr);
      EXPECT_LE(kernels::testing::RelError(h.conv.kernel()->grad.ToHost(),
                                           kernels::testing::ToDouble(want)),
                1e-6);
      EXPECT_NE(h.conv.kernel()->grad.ToHost(), exact.conv.kernel()->grad.ToHost());
    }
  }
}

TEST(SampledConvEngine, MaskedEntriesOfASampledGradientAreZero) {
  Harness h({1, 6, 6, 8}, {8, 3, 3, 1, 1, false}, 3);
  h.Setup(300);
  ASSERT_TRUE(
      h.conv.SampleWeightGradients(GradientSampling{1, GradientSampling::Scale::kUnbiased}).ok());
  std::vector<uint8_t> mask(h.conv.kernel()->size());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i / 8) % 3 != 0;
  ASSERT_TRUE(InstallMask(h.conv.kernel(), mask, MaskInfo{}).ok());
  h.Plan();
  h.conv.SetSampling(true);
  ASSERT_TRUE(h.conv.Forward(h.Io(), true).ok());
  ASSERT_TRUE(h.conv.Backward(h.Io()).ok());
  const auto grad = h.conv.kernel()->grad.ToHost();
  int nonzero = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (!mask[i]) {
      EXPECT_EQ(grad[i], 0.0f) << i;
    }
    nonzero += mask[i] && grad[i] != 0.0f;
  }
  EXPECT_GT(nonzero, 0);
}

TEST(SampledConvEngine, RefusesABadTopK) {
  Harness h({1, 4, 4, 3}, {2, 3, 3, 1, 1, false}, 1);
  h.Setup(5);
  const absl::Status st =
      h.conv.SampleWeightGradients(GradientSampling{0, GradientSampling::Scale::kUnbiased});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block.conv: top_k"), absl::string_view::npos) << st;
  EXPECT_EQ(h.conv.gradient_sampling(), nullptr);
}

}  // namespace
}  // namespace topiary
