#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>

#include "trainer/nn/layers.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/optim/optimizer.h"

// Counts heap allocations, so a test can check that a training step makes none. (The
// replacement pairs malloc with free, which GCC cannot see through.)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<long> g_allocations{0};
void* operator new(size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace topiary {
namespace {

int64_t Params(const std::string& arch, Shape4 in, int classes) {
  auto dev = MakeCpuDevice(0);
  auto m = BuildModel(arch, 1.0f, in, classes, dev.get());
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? (*m)->trainable_parameter_count() : -1;
}

// Parameter counts of the reference implementations (torchvision for ImageNet models; the
// CIFAR ResNets with projection shortcuts; LeNet-5 with 5x5 convolutions).
TEST(ModelZoo, ParameterCountsMatchReferences) {
  EXPECT_EQ(Params("resnet18", {1, 224, 224, 3}, 1000), 11689512);
  EXPECT_EQ(Params("resnet34", {1, 224, 224, 3}, 1000), 21797672);
  EXPECT_EQ(Params("resnet50", {1, 224, 224, 3}, 1000), 25557032);
  EXPECT_EQ(Params("lenet5", {1, 28, 28, 1}, 10), 61706);
  // resnet20: 269,722 with parameter-free (option A) shortcuts, the usual reference; ours
  // are 1x1 conv + BN projections (16->32 and 32->64: 512 + 64 and 2048 + 128 more).
  EXPECT_EQ(Params("resnet20", {1, 32, 32, 3}, 10), 269722 + 512 + 64 + 2048 + 128);
}

TEST(ModelZoo, StableLayerNamesAndShapes) {
  auto dev = MakeCpuDevice(0);
  auto m = BuildModel("resnet20", 1.0f, {1, 28, 28, 1}, 10, dev.get());
  ASSERT_TRUE(m.ok()) << m.status();
  for (const char* name :
       {"stem.conv", "stem.bn", "stage1.block0.conv1", "stage1.block0.bn1", "stage1.block2.conv2",
        "stage2.block0.shortcut.conv", "stage3.block0.shortcut.bn", "fc"}) {
    EXPECT_NE((*m)->FindLayer(name), nullptr) << name;
  }
  EXPECT_EQ((*m)->FindLayer("stage1.block0.shortcut.conv"), nullptr);  // identity shortcut
  for (const auto& arch : ModelNames()) {
    auto mm = BuildModel(arch, 0.5f, {1, 32, 32, 3}, 7, dev.get());
    EXPECT_TRUE(mm.ok()) << arch << ": " << mm.status();
  }
}

TEST(ModelZoo, ErrorsNameArchitectureAndLayer) {
  auto dev = MakeCpuDevice(0);
  auto bad = BuildModel("lenet5", 1.0f, {1, 8, 8, 1}, 10, dev.get());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("conv2"), std::string::npos) << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("8x8x1"), std::string::npos);
  auto unknown = BuildModel("alexnet", 1.0f, {1, 8, 8, 1}, 10, dev.get());
  EXPECT_NE(std::string(unknown.status().message()).find("model.arch"), std::string::npos);
}

// Whole-network check: the analytic gradient of the loss with respect to parameters and
// the wiring (residual splits and adds, BN in training mode) agrees with finite differences.
// A step can cross a ReLU or max-pool kink and make a single central difference wrong, so
// up to 5% of the entries may disagree; a wiring error (a lost gradient sum, a wrong input)
// breaks most of them.
void CheckNetworkGradients(const std::string& arch, Shape4 in, float width, int batch = 4) {
  auto dev = MakeCpuDevice(1);
  auto m = BuildModel(arch, width, in, 5, dev.get());
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->Initialize(3);
  auto net = Network::Plan(m->get(), batch, true);
  ASSERT_TRUE(net.ok()) << net.status();
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  const size_t n_in = in.per_image() * batch;
  for (size_t i = 0; i < n_in; ++i) (*net)->input()[i] = dist(gen);
  for (int i = 0; i < batch; ++i) (*net)->labels()[i] = (i * 3) % 5;
  auto loss = [&]() {
    EXPECT_TRUE((*net)->Forward(true).ok());
    EXPECT_TRUE((*net)->Loss(0.1f).ok());
    return (*net)->TakeMetrics()->loss();
  };
  loss();
  ASSERT_TRUE((*net)->Backward().ok());
  int checked = 0, bad = 0;
  for (Parameter* p : (*m)->parameters()) {
    if (!p->trainable) continue;
    const std::vector<float> grad = p->grad.ToHost();
    // A few entries per parameter: the largest-gradient one and one fixed index.
    size_t imax = 0;
    for (size_t i = 0; i < grad.size(); ++i)
      if (std::abs(grad[i]) > std::abs(grad[imax])) imax = i;
    for (size_t i : {imax, grad.size() / 2}) {
      if (std::abs(grad[i]) < 1e-2) continue;  // below float noise of the difference
      float* w = p->value.data() + i;
      const float old = *w;
      const float eps = 1e-4f * std::max(1.0f, std::abs(old));
      *w = old + eps;
      const double up = loss();
      *w = old - eps;
      const double down = loss();
      *w = old;
      const double numeric = (up - down) / (2 * eps);
      if (std::abs(grad[i] - numeric) > 0.05 * std::abs(numeric) + 5e-3) {
        ++bad;
        std::printf("%s[%zu]: analytic %g, numeric %g\n", p->full_name().c_str(), i, grad[i],
                    numeric);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
  EXPECT_LE(bad, checked / 20) << bad << " of " << checked << " entries disagree";
}

TEST(Network, Resnet20GradientsMatchFiniteDifferences) {
  CheckNetworkGradients("resnet20", {1, 16, 16, 2}, 0.25f);
}

TEST(Network, Lenet5GradientsMatchFiniteDifferences) {
  CheckNetworkGradients("lenet5", {1, 16, 16, 1}, 0.5f);
}

// Bottleneck blocks with 1x1 (pointwise) convolutions and projection shortcuts. Batch norm
// must see enough values per channel: at 64x64 and batch 4 the last stage normalizes over
// 16 values, the loss is far from linear at the step size, and ~6% of entries disagree; at
// 128x128 and batch 16 (256 values) under 3% do.
TEST(Network, Resnet50GradientsMatchFiniteDifferences) {
  CheckNetworkGradients("resnet50", {1, 128, 128, 3}, 0.125f, 16);
}

// ImageNet-style stem (7x7/2 conv, padded 3x3/2 max pool), 16 basic blocks.
TEST(Network, Resnet34GradientsMatchFiniteDifferences) {
  CheckNetworkGradients("resnet34", {1, 64, 64, 3}, 0.125f);
}

TEST(Network, Bf16IsRefusedOnTheCpu) {
  auto dev = MakeCpuDevice(1);
  auto m = BuildModel("lenet5", 1.0f, {1, 28, 28, 1}, 10, dev.get());
  ASSERT_TRUE(m.ok()) << m.status();
  PlanOptions bf16;
  bf16.precision = kernels::Precision::kBf16;
  auto net = Network::Plan(m->get(), 4, true, bf16);
  ASSERT_FALSE(net.ok());
  EXPECT_EQ(net.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(net.status().message().find("bf16 precision needs a GPU"), std::string::npos)
      << net.status();
  EXPECT_TRUE(Network::Plan(m->get(), 4, true).ok());  // the model is still usable in fp32
}

// Device memory is planned once with either CPU convolution backend. The reference kernels
// make no heap allocation at all inside a step; oneDNN's primitives allocate their own small
// bookkeeping per call (its execute() builds an argument map), so that count is checked with
// the reference only.
void CheckPlannedMemoryIsAllocatedOnce(bool reference) {
  if (reference) {
    setenv("TOPIARY_CPU_CONV", "reference", 1);
  } else {
    unsetenv("TOPIARY_CPU_CONV");
  }
  auto dev = MakeCpuDevice(1);
  auto m = BuildModel("resnet20", 1.0f, {1, 28, 28, 1}, 10, dev.get());
  ASSERT_TRUE(m.ok());
  (*m)->Initialize(1);
  auto net = Network::Plan(m->get(), 8, true);
  ASSERT_TRUE(net.ok());
  std::fill((*net)->labels(), (*net)->labels() + 8, 1);
  topiary::v1::OptimizerSpec spec;
  SgdOptimizer opt((*m)->parameters(), spec, dev.get());
  auto clock = TrainingClock::Create(dev.get(), std::vector<float>(8, 0.01f));
  ASSERT_TRUE(clock.ok());
  auto step = [&]() {
    bool ok = clock->Tick(8).ok();
    ok = ok && (*net)->Forward(true).ok() && (*net)->Loss(0.0f).ok();
    ok = ok && (*net)->Backward().ok() && opt.Step(clock->clock()).ok();
    return ok;
  };
  ASSERT_TRUE(step());  // warm-up: thread pools start
  const size_t before = dev->allocated_bytes();
  const long allocations = g_allocations.load();
  const bool ok = step() && step();
  const long during = g_allocations.load() - allocations;
  ASSERT_TRUE(ok);
  if (reference) {
    EXPECT_EQ(during, 0) << "heap allocations inside training steps";
  }
  EXPECT_EQ(dev->allocated_bytes(), before);
  EXPECT_GT((*net)->planned_bytes(), 0u);
  unsetenv("TOPIARY_CPU_CONV");
}

// The plan report: one line per layer, named, saying what runs it. On the CPU: every exact
// convolution's kernels, an approximate one's multiplier, and every add unfused, with why.
TEST(Network, PlanReportNamesWhatRunsEveryLayer) {
  auto dev = MakeCpuDevice(1);
  auto m = BuildModel("resnet20", 0.5f, {1, 16, 16, 3}, 10, dev.get());
  ASSERT_TRUE(m.ok()) << m.status();
  Conv2d* approx = nullptr;  // the second convolution (the first is the stem)
  int seen = 0;
  for (const auto& node : (*m)->nodes()) {
    auto* conv = dynamic_cast<Conv2d*>(node.layer);
    if (conv != nullptr && seen++ == 1) approx = conv;
  }
  ASSERT_NE(approx, nullptr);
  ConvApproximation table;
  table.multiplier = "exact8";
  table.table.resize(65536);
  for (int i = 0; i < 65536; ++i) table.table[i] = static_cast<uint16_t>((i >> 8) * (i & 255));
  ASSERT_TRUE(approx->Approximate(table, dev.get()).ok());
  auto net = Network::Plan(m->get(), 4, true);
  ASSERT_TRUE(net.ok()) << net.status();
  const std::vector<std::string> report = (*net)->PlanReport();
  ASSERT_EQ(report.size(), (*m)->nodes().size());
  int convs = 0, adds = 0;
  for (size_t j = 0; j < report.size(); ++j) {
    const Layer& layer = *(*m)->nodes()[j].layer;
    const std::string& line = report[j];
    EXPECT_EQ(line.rfind(layer.name() + " (" + layer.type() + ")", 0), 0u) << line;
    if (layer.kind() == LayerKind::kConv2d) {
      ++convs;
      if (&layer == approx) {
        EXPECT_NE(line.find(": approximate multiplier exact8"), std::string::npos) << line;
      } else {
        EXPECT_TRUE(line.find(": im2col + GEMM") != std::string::npos ||
                    line.find(": oneDNN") != std::string::npos)
            << line;
      }
    }
    if (layer.kind() == LayerKind::kAdd) {
      ++adds;
      EXPECT_NE(line.find(": unfused: the CPU runs every layer on its own"), std::string::npos)
          << line;
    }
  }
  EXPECT_GT(convs, 10);
  EXPECT_EQ(adds, 9);  // resnet20's residual blocks
}

TEST(Network, PlannedMemoryIsAllocatedOnce) {
  CheckPlannedMemoryIsAllocatedOnce(true);
  CheckPlannedMemoryIsAllocatedOnce(false);
}

// Activations no backward pass reads, and gradients past their reader, give their memory
// back: a training network plans less than one buffer per value and gradient, and an
// inference network (which keeps nothing past the forward pass) less than a training one.
TEST(Network, PlannedMemoryIsReusedByLifetime) {
  auto dev = MakeCpuDevice(1);
  for (const char* arch : {"resnet20", "resnet50"}) {
    auto m = BuildModel(arch, 0.5f, {1, 32, 32, 3}, 10, dev.get());
    ASSERT_TRUE(m.ok());
    size_t every_value = 0;
    for (const Shape4& s : (*m)->value_shapes()) every_value += s.per_image() * 16 * sizeof(float);
    auto train = Network::Plan(m->get(), 16, true);
    auto infer = Network::Plan(m->get(), 16, false);
    ASSERT_TRUE(train.ok() && infer.ok());
    std::printf("%s batch 16: every value %zu bytes, training arena %zu, inference arena %zu\n",
                arch, every_value, (*train)->activation_bytes(), (*infer)->activation_bytes());
    // Before lifetimes, the values alone took every_value, their gradients more.
    EXPECT_LT((*train)->activation_bytes(), every_value) << arch;
    EXPECT_LT((*infer)->activation_bytes(), every_value / 3) << arch;
  }
}

}  // namespace
}  // namespace topiary
