// Pruning rounds on a GPU (tagged gpu; skips, saying why, without one): masks are enforced
// by the CUDA optimizer inside captured CUDA graphs, block rounds reach their target, and
// channel pruning compacts exactly and trains the smaller networks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pruning/rounds_test_util.h"
#include "trainer/core/device.h"
#include "trainer/nn/channels.h"
#include "trainer/nn/graph.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/nn/test_graphs.h"
#include "trainer/run/runner_test_util.h"

namespace topiary {
namespace {

using testing::CheckMaskedCheckpoint;
using testing::OutDir;
using testing::Parse;
using testing::PruningOptions;

class RoundsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (ListGpus(&why).empty()) GTEST_SKIP() << "no usable GPU: " << why;
  }
};

TEST_F(RoundsGpu, BlockAndNofMMasksHoldAfterGraphReplayedFineTuning) {
  for (const char* method : {"BLOCK", "N_OF_M", "MAGNITUDE"}) {
    auto spec = testing::SyntheticRun(std::string(R"(
      name: "gpu-rounds" seed: 5
      data { synthetic { test_size: 160 } }
      train { epochs: 1 }
      pruning { block_in: 4 block_out: 4 target: 0.5 step_fraction: 0.5 finetune_epochs: 2 method: )") +
                                      method + R"( }
      device { kind: CUDA threads: 0 })");
    const auto s = RunExperiment(spec, PruningOptions(OutDir(method)));
    ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << method << ": " << s.error();
    const auto& last = s.rounds(s.rounds_size() - 1);
    EXPECT_EQ(last.layers_at_target(), last.layers_pruned()) << method;
    const testing::MaskCheck check = CheckMaskedCheckpoint(s.checkpoint(), 0.5);
    EXPECT_GE(check.masked_layers, 20) << method;
    if (std::string(method) == "BLOCK") {
      EXPECT_EQ(check.block_layers_at_target, 20);
      // Checkpoints load onto the GPU: resuming from round 1 ends where the run ended.
      RunOptions options = PruningOptions(OutDir("resumed"));
      options.resume_from = OutDir(method) + "/checkpoints/round-001.h5";
      const auto resumed = RunExperiment(spec, options);
      ASSERT_EQ(resumed.state(), topiary::v1::SUCCEEDED) << resumed.error();
      EXPECT_EQ(resumed.rounds_size(), s.rounds_size());
      EXPECT_EQ(resumed.sparsity(), s.sparsity());
      EXPECT_EQ(CheckMaskedCheckpoint(resumed.checkpoint(), 0.5).block_layers_at_target, 20);
    }
  }
}

// The logits of `model` (on its device) for a fixed random batch, in inference mode.
std::vector<float> GpuLogits(Model* model, int batch = 4) {
  auto net = Network::Plan(model, batch, /*training=*/false);
  EXPECT_TRUE(net.ok()) << net.status();
  if (!net.ok()) return {};
  std::vector<float> x(batch * model->input_shape().per_image());
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& v : x) v = n(rng);
  Device* d = model->device();
  d->CopyFromHost((*net)->input(), x.data(), x.size() * sizeof(float));
  EXPECT_TRUE((*net)->Forward(false).ok());
  std::vector<float> y(batch * model->classes());
  d->CopyToHost(y.data(), (*net)->logits(), y.size() * sizeof(float));
  EXPECT_TRUE(d->Synchronize().ok());
  return y;
}

// Compaction on the GPU: every zoo network and two imported-style graphs (MobileNetV2 blocks;
// add, depthwise, concat and flatten), compacted (cuDNN), compute what the network with the
// removed channels zeroed computes; and channel-pruning rounds train ever smaller networks
// inside captured CUDA graphs, in fp32 and bf16, a resumed run ending where the run ended.
TEST_F(RoundsGpu, ChannelPruningCompactsExactlyAndTrainsSmallerNetworks) {
  auto dev = MakeCudaDevice(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  std::vector<std::pair<std::string, absl::StatusOr<std::unique_ptr<Model>>>> models;
  for (const std::string& arch : ModelNames()) {
    if (arch == "resnet110" || arch == "resnet44") continue;  // resnet20-56 cover the family
    const bool imagenet = arch == "resnet18" || arch == "resnet34" || arch == "resnet50";
    models.emplace_back(
        arch, BuildModel(arch, imagenet ? 0.25f : 0.5f,
                         imagenet ? Shape4{1, 32, 32, 3} : Shape4{1, 12, 12, 2}, 5, dev->get()));
  }
  models.emplace_back("mobilenet graph",
                      BuildModelFromGraph(testing::MobileNetGraph(), dev->get()));
  models.emplace_back("coupled graph", BuildModelFromGraph(testing::CoupledGraph(), dev->get()));
  for (auto& [name, model] : models) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(model.ok()) << model.status();
    (*model)->Initialize(3);
    auto groups = FindChannelGroups(**model);
    ASSERT_TRUE(groups.ok()) << groups.status();
    std::vector<bool> remove(groups->classes.size(), false);
    for (const auto& g : groups->groups) {
      if (!g.fixed.empty()) continue;
      for (size_t i = 0; i < g.classes.size(); i += 3) remove[g.classes[i]] = true;
    }
    auto small = CompactModel(**model, *groups, remove);
    ASSERT_TRUE(small.ok()) << small.status();
    ZeroChannels(model->get(), *groups, remove);
    const auto want = GpuLogits(model->get()), got = GpuLogits(small->get());
    ASSERT_EQ(want.size(), got.size());
    double err = 0, scale = 1e-6;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    EXPECT_LT(err / scale, 1e-5);
    EXPECT_GT(scale, 1e-3);  // logits that are not all zero: the comparison says something
    std::printf("compaction on the GPU, %s: max relative difference %.2e (largest logit %.3g)\n",
                name.c_str(), err / scale, scale);
  }

  for (const char* precision : {"FP32", "BF16"}) {
    auto spec = testing::SyntheticRun(std::string(R"(
      name: "gpu-channels" seed: 5
      data { synthetic { test_size: 160 } }
      train { epochs: 1 precision: )") +
                                      precision + R"( }
      pruning { method: CHANNEL target: 0.5 step_fraction: 0.5 finetune_epochs: 1 }
      device { kind: CUDA threads: 0 deterministic: true })");
    const std::string dir = OutDir(std::string("channels-") + precision);
    const auto s = RunExperiment(spec, PruningOptions(dir));
    ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << precision << ": " << s.error();
    ASSERT_EQ(s.rounds_size(), 3) << precision;
    for (int i = 1; i < s.rounds_size(); ++i) {
      EXPECT_LT(s.rounds(i).multiply_adds(), s.rounds(i - 1).multiply_adds()) << precision;
    }
    RunOptions options = PruningOptions(OutDir(std::string("channels-resumed-") + precision));
    options.resume_from = dir + "/checkpoints/round-001.h5";
    const auto resumed = RunExperiment(spec, options);
    ASSERT_EQ(resumed.state(), topiary::v1::SUCCEEDED) << resumed.error();
    EXPECT_EQ(resumed.rounds(2).multiply_adds(), s.rounds(2).multiply_adds()) << precision;
    EXPECT_EQ(resumed.test_loss(), s.test_loss()) << precision;
  }
}

TEST_F(RoundsGpu, MasksHoldInBf16) {
  // bf16 kernels read weight copies cast from the fp32 masters before every pass; the masks
  // are projected on the masters, so masked weights and momentum stay exactly zero.
  auto spec = testing::SyntheticRun(R"(
    name: "gpu-rounds-bf16" seed: 5
    data { synthetic { test_size: 160 } }
    train { epochs: 1 precision: BF16 }
    pruning { block_in: 4 block_out: 4 target: 0.5 step_fraction: 0.5 finetune_epochs: 2
              method: BLOCK score: GRAD_L2 }
    device { kind: CUDA threads: 0 })");
  const auto s = RunExperiment(spec, PruningOptions(OutDir("bf16")));
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  const testing::MaskCheck check = CheckMaskedCheckpoint(s.checkpoint(), 0.5);
  EXPECT_EQ(check.block_layers_at_target, 20);
  EXPECT_GT(s.test_top1(), 0.5);
}

// A bf16 block-pruning run of resnet20 (16/32/64 channels: the tensor-core path) whose masked
// convolutions all run on the block-sparse kernels
// (TOPIARY_SPARSE_CONV=on, forward, backward data and filter) trains like the same run on
// cuDNN (=off): losses that agree to bf16 rounding, bit-deterministic, and round reports that
// say which kernels ran.
TEST_F(RoundsGpu, BlockSparseKernelsTrainLikeDenseOnes) {
  auto spec = testing::SyntheticRun(R"(
    model { width: 1 }
    train { epochs: 1 precision: BF16 }
    pruning { method: BLOCK target: 0.5 step_fraction: 0.5 finetune_epochs: 1 max_rounds: 2 }
    device { kind: CUDA threads: 0 deterministic: true })");
  auto run = [&](const char* mode) {
    setenv("TOPIARY_SPARSE_CONV", mode, 1);
    testing::Trace t = testing::RunAndTrace(spec, PruningOptions(OutDir(mode)));
    unsetenv("TOPIARY_SPARSE_CONV");
    return t;
  };
  const testing::Trace sparse = run("on"), sparse2 = run("on"), dense = run("off");
  ASSERT_EQ(sparse.summary.state(), topiary::v1::SUCCEEDED) << sparse.summary.error();
  ASSERT_EQ(dense.summary.state(), topiary::v1::SUCCEEDED) << dense.summary.error();
  EXPECT_EQ(sparse.losses, sparse2.losses);  // the kernels use no atomics
  ASSERT_EQ(sparse.losses.size(), dense.losses.size());
  const size_t n = sparse.losses.size();
  std::printf("block-sparse vs dense: last loss %.5f vs %.5f, top-1 %.4f vs %.4f\n",
              sparse.losses[n - 1], dense.losses[n - 1], sparse.summary.test_top1(),
              dense.summary.test_top1());
  // The dense epoch (20 steps, no mask yet) runs the same kernels: bit for bit. The first step
  // after the first prune step computes the same function with other kernels: bf16 rounding
  // apart. Later steps drift apart as any two kernel choices do; the runs end alike.
  constexpr size_t kDenseSteps = 20;
  ASSERT_GT(n, kDenseSteps + 1);
  for (size_t i = 0; i < kDenseSteps; ++i) EXPECT_EQ(sparse.losses[i], dense.losses[i]) << i;
  EXPECT_NEAR(sparse.losses[kDenseSteps], dense.losses[kDenseSteps],
              0.02 * std::abs(dense.losses[kDenseSteps]));
  double sparse_tail = 0, dense_tail = 0;
  for (size_t i = n - 10; i < n; ++i)
    sparse_tail += sparse.losses[i], dense_tail += dense.losses[i];
  EXPECT_NEAR(sparse_tail, dense_tail, 0.25 * dense_tail + 0.1);
  EXPECT_NEAR(sparse.summary.test_top1(), dense.summary.test_top1(), 0.05);
  ASSERT_EQ(sparse.summary.rounds_size(), dense.summary.rounds_size());
  int sparse_layers = 0;
  for (const auto& l : sparse.summary.rounds(sparse.summary.rounds_size() - 1).layers()) {
    if (l.mask() != topiary::v1::MASK_BLOCK) continue;
    EXPECT_EQ(l.forward().chosen(), topiary::v1::ConvPassChoice::BLOCK_SPARSE) << l.layer();
    EXPECT_EQ(l.backward_filter().chosen(), topiary::v1::ConvPassChoice::BLOCK_SPARSE) << l.layer();
    ++sparse_layers;
  }
  EXPECT_GT(sparse_layers, 10);
  for (const auto& l : dense.summary.rounds(dense.summary.rounds_size() - 1).layers()) {
    EXPECT_FALSE(l.has_forward()) << l.layer() << ": dispatch is off";
  }
}

}  // namespace
}  // namespace topiary
