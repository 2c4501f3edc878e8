// Pruning rounds on a GPU (tagged gpu; skips, saying why, without one): masks are enforced
// by the CUDA optimizer inside captured CUDA graphs, and block rounds reach their target.
#include <gtest/gtest.h>

#include "pruning/rounds_test_util.h"
#include "trainer/core/device.h"
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
    auto spec = Parse(std::string(R"(
      name: "gpu-rounds" seed: 5
      model { arch: "resnet20" width: 0.5 }
      data { dataset: SYNTHETIC batch_size: 32
             synthetic { height: 12 width: 12 channels: 2 classes: 5 train_size: 640 test_size: 160 } }
      train { epochs: 1 optimizer { lr: 0.05 } }
      pruning { block_in: 4 block_out: 4 target: 0.5 step_fraction: 0.5 finetune_epochs: 2 method: )") +
                      method + R"( }
      device { kind: CUDA })");
    const auto s = RunExperiment(spec, PruningOptions(OutDir(method)));
    ASSERT_EQ(s.state(), "SUCCEEDED") << method << ": " << s.error();
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
      ASSERT_EQ(resumed.state(), "SUCCEEDED") << resumed.error();
      EXPECT_EQ(resumed.rounds_size(), s.rounds_size());
      EXPECT_EQ(resumed.sparsity(), s.sparsity());
      EXPECT_EQ(CheckMaskedCheckpoint(resumed.checkpoint(), 0.5).block_layers_at_target, 20);
    }
  }
}

TEST_F(RoundsGpu, MasksHoldInBf16) {
  // bf16 kernels read weight copies cast from the fp32 masters before every pass; the masks
  // are projected on the masters, so masked weights and momentum stay exactly zero.
  auto spec = Parse(R"(
    name: "gpu-rounds-bf16" seed: 5
    model { arch: "resnet20" width: 0.5 }
    data { dataset: SYNTHETIC batch_size: 32
           synthetic { height: 12 width: 12 channels: 2 classes: 5 train_size: 640 test_size: 160 } }
    train { epochs: 1 optimizer { lr: 0.05 } precision: BF16 }
    pruning { block_in: 4 block_out: 4 target: 0.5 step_fraction: 0.5 finetune_epochs: 2
              method: BLOCK score: GRAD_L2 }
    device { kind: CUDA })");
  const auto s = RunExperiment(spec, PruningOptions(OutDir("bf16")));
  ASSERT_EQ(s.state(), "SUCCEEDED") << s.error();
  const testing::MaskCheck check = CheckMaskedCheckpoint(s.checkpoint(), 0.5);
  EXPECT_EQ(check.block_layers_at_target, 20);
  EXPECT_GT(s.test_top1(), 0.5);
}

}  // namespace
}  // namespace topiary
