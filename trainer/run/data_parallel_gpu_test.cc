// Data parallelism on two GPUs through NCCL (tagged gpu; skips, saying why, with fewer):
// two GPUs train as one does, the ordered reduction repeats bit for bit and captured CUDA
// graphs (NCCL inside) replay what eager launches compute, bf16 runs keep the ranks
// identical, a run resumes on another GPU count, and synchronized batch norm trains as one GPU
// holding the global batch does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "trainer/core/device.h"
#include "trainer/run/runner.h"
#include "trainer/run/runner_test_util.h"

namespace topiary {
namespace {

using testing::Parse;
using testing::Trace;

constexpr char kSpec[] = R"(
  seed: 3
  model { arch: "resnet20" width: 0.5 }
  data { dataset: SYNTHETIC batch_size: 64
         synthetic { height: 16 width: 16 channels: 3 classes: 5 train_size: 1280 test_size: 320 } }
  train { epochs: 2 optimizer { lr: 0.02 } }
  checkpoints { every_epochs: 1 }
  device { kind: CUDA deterministic: true }
)";

class DataParallelGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    const auto gpus = ListGpus(&why);
    if (gpus.size() < 2) {
      GTEST_SKIP() << "no usable GPU pair: needs two GPUs, found " << gpus.size()
                   << (gpus.empty() ? " (" + why + ")" : "");
    }
  }
};

// Runs `spec` with its outputs in the folder `out` (resuming from `resume` when given).
Trace RunSpec(const topiary::v1::ExperimentSpec& spec, const std::string& out,
              const std::string& resume = "") {
  RunOptions o;
  o.out_dir = testing::TempDir(out);
  o.resume_from = resume;
  return testing::RunAndTrace(spec, o);
}

// Each checkpoint event's ranks_identical.
std::vector<int> RanksIdentical(const Trace& t) {
  std::vector<int> out;
  for (const auto& c : t.checkpoints) out.push_back(c.ranks_identical());
  return out;
}

topiary::v1::ExperimentSpec WithGpus(int n) {
  auto spec = Parse(kSpec);
  spec.mutable_device()->set_gpu_count(n);
  return spec;
}

TEST_F(DataParallelGpu, OrderedReductionRepeatsBitForBitAndGraphsMatchEager) {
  const Trace a = RunSpec(WithGpus(2), "a"), b = RunSpec(WithGpus(2), "b");
  ASSERT_EQ(a.summary.state(), topiary::v1::SUCCEEDED) << a.summary.error();
  EXPECT_NE(a.started.gradient_reduction().find("ordered"), std::string::npos)
      << a.started.gradient_reduction();
  EXPECT_EQ(a.losses.size(), 40u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(RanksIdentical(a), (std::vector<int>{2, 2}));
  auto eager = WithGpus(2);
  eager.mutable_device()->set_cuda_graphs(topiary::v1::DeviceSpec::GRAPHS_OFF);
  EXPECT_EQ(RunSpec(eager, "eager").losses, a.losses);
  // One GPU, the same global batch: the same training up to batch norm's per-rank
  // statistics (32 images each instead of 64).
  const Trace one = RunSpec(WithGpus(1), "one");
  ASSERT_EQ(one.summary.state(), topiary::v1::SUCCEEDED) << one.summary.error();
  printf("loss after 2 epochs: 2 GPUs %.4f, 1 GPU %.4f; top-1 %.4f vs %.4f\n", a.losses.back(),
         one.losses.back(), a.summary.test_top1(), one.summary.test_top1());
  EXPECT_NEAR(a.losses.front(), one.losses.front(), 0.05);
  EXPECT_NEAR(a.summary.test_top1(), one.summary.test_top1(), 0.1);
}

TEST_F(DataParallelGpu, Bf16KeepsRanksIdenticalAndResumesOnOneGpu) {
  auto spec = WithGpus(2);
  spec.mutable_device()->set_deterministic(false);
  spec.mutable_train()->set_precision(topiary::v1::TrainSpec::BF16);
  const Trace full = RunSpec(spec, "bf16");
  ASSERT_EQ(full.summary.state(), topiary::v1::SUCCEEDED) << full.summary.error();
  EXPECT_EQ(full.started.gradient_reduction().find("ordered"), std::string::npos)
      << full.started.gradient_reduction();
  EXPECT_EQ(RanksIdentical(full), (std::vector<int>{2, 2}));
  EXPECT_GT(full.summary.test_top1(), 0.5);
  auto one = spec;
  one.mutable_device()->set_gpu_count(1);
  const Trace resumed =
      RunSpec(one, "bf16-resumed", testing::TempDir("bf16") + "/checkpoints/epoch-0001.h5");
  ASSERT_EQ(resumed.summary.state(), topiary::v1::SUCCEEDED) << resumed.summary.error();
  EXPECT_EQ(resumed.losses.size(), 20u);
  EXPECT_NEAR(resumed.summary.test_top1(), full.summary.test_top1(), 0.1);
}

// Synchronized batch norm: two GPUs, each with half the global batch, train as one GPU holding
// it (fp32, TF32 off: only the order of float additions differs) and far closer than two
// unsynchronized GPUs; in bf16 the ranks stay identical and reach one GPU's accuracy.
TEST_F(DataParallelGpu, SyncBatchNormTrainsAsOneGpuWithTheGlobalBatch) {
  auto fp32 = [](int gpus, bool sync) {
    auto spec = WithGpus(gpus);
    spec.mutable_train()->set_precision(topiary::v1::TrainSpec::FP32);
    spec.mutable_device()->set_sync_batch_norm(sync);
    return spec;
  };
  const Trace one = RunSpec(fp32(1, false), "sync-one");
  const Trace synced = RunSpec(fp32(2, true), "sync-two");
  const Trace apart = RunSpec(fp32(2, false), "sync-apart");
  for (const Trace* t : {&one, &synced, &apart}) {
    ASSERT_EQ(t->summary.state(), topiary::v1::SUCCEEDED) << t->summary.error();
    ASSERT_EQ(t->losses.size(), 40u);
  }
  EXPECT_EQ(RanksIdentical(synced), (std::vector<int>{2, 2}));
  for (size_t i = 0; i < 4; ++i) {
    printf("step %zu: one GPU %.9f, two synced %.9f, two apart %.9f\n", i, one.losses[i],
           synced.losses[i], apart.losses[i]);
  }
  double synced_gap = 0, apart_gap = 0;
  for (size_t i = 0; i < one.losses.size(); ++i) {
    synced_gap = std::max(synced_gap, std::fabs(synced.losses[i] - one.losses[i]));
    apart_gap = std::max(apart_gap, std::fabs(apart.losses[i] - one.losses[i]));
  }
  printf(
      "largest loss gap to one GPU over 40 steps: synced %.3g, apart %.3g; top-1 %.4f %.4f %.4f\n",
      synced_gap, apart_gap, one.summary.test_top1(), synced.summary.test_top1(),
      apart.summary.test_top1());
  EXPECT_NEAR(synced.losses[0], one.losses[0], 1e-5);  // the statistics, forward
  EXPECT_NEAR(synced.losses[1], one.losses[1], 1e-5);  // and the gradients of step 0
  EXPECT_GT(std::fabs(apart.losses[0] - one.losses[0]),
            10 * std::fabs(synced.losses[0] - one.losses[0]));
  EXPECT_NEAR(synced.summary.test_top1(), one.summary.test_top1(), 0.05);

  auto bf16 = [](int gpus, bool sync) {
    auto spec = WithGpus(gpus);
    spec.mutable_device()->set_deterministic(false);
    spec.mutable_train()->set_precision(topiary::v1::TrainSpec::BF16);
    spec.mutable_device()->set_sync_batch_norm(sync);
    return spec;
  };
  const Trace one16 = RunSpec(bf16(1, false), "sync-one-bf16");
  const Trace synced16 = RunSpec(bf16(2, true), "sync-two-bf16");
  for (const Trace* t : {&one16, &synced16}) {
    ASSERT_EQ(t->summary.state(), topiary::v1::SUCCEEDED) << t->summary.error();
  }
  printf("bf16: first loss one GPU %.5f, two synced %.5f; top-1 %.4f vs %.4f\n", one16.losses[0],
         synced16.losses[0], one16.summary.test_top1(), synced16.summary.test_top1());
  EXPECT_EQ(RanksIdentical(synced16), (std::vector<int>{2, 2}));
  EXPECT_NEAR(synced16.losses[0], one16.losses[0], 2e-2);
  EXPECT_NEAR(synced16.summary.test_top1(), one16.summary.test_top1(), 0.1);
}

}  // namespace
}  // namespace topiary
