// Data parallelism through the runner, on CPU ranks (the same code path as GPUs, with the
// host collective instead of NCCL): ranks average to the single-rank run, repeat bit for
// bit, resume on another rank count, and refuse batches that do not split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "trainer/run/runner.h"
#include "trainer/run/runner_test_util.h"

namespace topiary {
namespace {

using testing::Parse;
using testing::RunAndTrace;
using testing::Trace;

// lenet5 has no batch norm, so two ranks of 16 images compute the gradient of 32 exactly
// as one rank does, up to the order of float additions.
constexpr char kLenet[] = R"(
  seed: 3
  model { arch: "lenet5" }
  data { dataset: SYNTHETIC batch_size: 32
         synthetic { height: 28 width: 28 channels: 1 classes: 5 train_size: 640 test_size: 320 } }
  train { epochs: 2 optimizer { lr: 0.01 } }
  checkpoints { every_epochs: 1 }
  device { kind: CPU threads: 1 }
)";

topiary::v1::ExperimentSpec WithRanks(int ranks) {
  auto spec = Parse(kLenet);
  spec.mutable_device()->set_cpu_ranks(ranks);
  return spec;
}

void ExpectClose(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], tol * std::fabs(b[i]) + 1e-5) << "step " << i;
  }
}

TEST(DataParallel, TwoRanksTrainAsOneRankDoes) {
  const Trace one = RunAndTrace(WithRanks(1));
  const Trace two = RunAndTrace(WithRanks(2));
  ASSERT_EQ(one.summary.state(), topiary::v1::SUCCEEDED) << one.summary.error();
  ASSERT_EQ(two.summary.state(), topiary::v1::SUCCEEDED) << two.summary.error();
  EXPECT_EQ(two.started.ranks(), 2);
  EXPECT_EQ(two.started.gradient_reduction(), "host");
  EXPECT_EQ(one.started.ranks(), 0) << "one rank: no collective";
  EXPECT_EQ(two.losses.size(), 40u);  // 2 epochs x 20 steps of the global batch
  // Rounding differences only (they grow slowly over 40 steps).
  ExpectClose(two.losses, one.losses, 1e-3);
  EXPECT_NEAR(two.summary.test_top1(), one.summary.test_top1(), 0.02);
  printf("losses: first %.6f last %.6f (one rank %.6f); top-1 %.4f (one rank %.4f)\n",
         two.losses.front(), two.losses.back(), one.losses.back(), two.summary.test_top1(),
         one.summary.test_top1());
  // The same spec again: bit for bit.
  EXPECT_EQ(RunAndTrace(WithRanks(2)).losses, two.losses);
}

TEST(DataParallel, ResumesOnAnotherRankCount) {
  const std::string dir = testing::TempDir("dp-full");
  RunOptions full_options;
  full_options.out_dir = dir;
  const Trace full = RunAndTrace(WithRanks(2), full_options);
  ASSERT_EQ(full.summary.state(), topiary::v1::SUCCEEDED) << full.summary.error();
  for (int ranks : {1, 2, 4}) {
    RunOptions o;
    o.out_dir = testing::TempDir("dp-resumed-" + std::to_string(ranks));
    o.resume_from = dir + "/checkpoints/epoch-0001.h5";
    const Trace resumed = RunAndTrace(WithRanks(ranks), o);
    ASSERT_EQ(resumed.summary.state(), topiary::v1::SUCCEEDED)
        << ranks << ": " << resumed.summary.error();
    ASSERT_EQ(resumed.losses.size(), 20u) << "the second epoch only";
    const std::vector<double> tail(full.losses.end() - 20, full.losses.end());
    if (ranks == 2) {
      EXPECT_EQ(resumed.losses, tail) << "the same ranks continue bit for bit";
    } else {
      ExpectClose(resumed.losses, tail, 1e-3);
    }
  }
}

TEST(DataParallel, RefusesBatchesThatDoNotSplit) {
  auto spec = WithRanks(3);
  const Trace t = RunAndTrace(spec);
  EXPECT_EQ(t.summary.state(), topiary::v1::FAILED);
  EXPECT_NE(t.summary.error().find("data.batch_size"), std::string::npos) << t.summary.error();
  EXPECT_NE(t.summary.error().find("3 CPU ranks"), std::string::npos) << t.summary.error();

  auto gpus = Parse(kLenet);
  gpus.mutable_device()->add_gpus(0);
  gpus.mutable_device()->set_gpu_count(2);
  const Trace g = RunAndTrace(gpus);
  EXPECT_EQ(g.summary.state(), topiary::v1::FAILED);
  EXPECT_NE(g.summary.error().find("device.gpu_count"), std::string::npos) << g.summary.error();

  auto twice = Parse(kLenet);
  twice.mutable_device()->add_gpus(1);
  twice.mutable_device()->add_gpus(1);
  const Trace d = RunAndTrace(twice);
  EXPECT_NE(d.summary.error().find("appears twice"), std::string::npos) << d.summary.error();
}

// resnet20 has batch norm: each rank normalizing over its own 8 images is not what one rank
// with all 16 computes. With device.sync_batch_norm the ranks exchange the statistics and
// train as the single rank does, up to rounding; without it they drift apart further.
// Synchronized batch norm to float rounding: resnet20 at half width, batch 64 over two CPU
// ranks, takes its first steps as one rank holding the batch does, to a few units of 1e-9
// of the loss. (Then training is chaotic: one rank on another thread count, which changes
// only the order of some float additions, drifts 5e-7 by step 6 and 5e-4 by step 12, and two
// ranks alike.) When the ranks exchanged their statistics' sums as floats, the backward
// pass's nearly cancelling sums lost their low digits: 4.8e-6 apart already at step 1 (the
// first step after an update), 4.7e-5 at step 2.
TEST(DataParallel, SyncBatchNormMatchesOneRankToRounding) {
  constexpr char kHalf[] = R"(
    seed: 4
    model { arch: "resnet20" width: 0.5 }
    data { dataset: SYNTHETIC batch_size: 64
           synthetic { height: 28 width: 28 channels: 1 classes: 10 train_size: 320 test_size: 64 } }
    train { epochs: 1 optimizer { lr: 0.01 momentum: 0.9 } }
    device { kind: CPU threads: 2 }
  )";
  const Trace one = RunAndTrace(Parse(kHalf));
  auto spec = Parse(kHalf);
  spec.mutable_device()->set_cpu_ranks(2);
  spec.mutable_device()->set_sync_batch_norm(true);
  const Trace synced = RunAndTrace(spec);
  for (const Trace* t : {&one, &synced}) {
    ASSERT_EQ(t->summary.state(), topiary::v1::SUCCEEDED) << t->summary.error();
    ASSERT_EQ(t->losses.size(), 5u);
  }
  for (size_t i = 0; i < 5; ++i) {
    printf("step %zu: one rank %.9f, two synced ranks %.9f\n", i, one.losses[i], synced.losses[i]);
  }
  EXPECT_NEAR(synced.losses[0], one.losses[0], 1e-7);  // the statistics, forward
  EXPECT_NEAR(synced.losses[1], one.losses[1], 1e-7);  // and the gradients of step 0
}

TEST(DataParallel, SyncBatchNormTrainsAsOneRankWithTheGlobalBatch) {
  constexpr char kResnet[] = R"(
    seed: 4
    model { arch: "resnet20" width: 0.25 }
    data { dataset: SYNTHETIC batch_size: 16
           synthetic { height: 8 width: 8 channels: 2 classes: 3 train_size: 160 test_size: 64 } }
    train { epochs: 1 optimizer { lr: 0.05 momentum: 0.9 } }
    device { kind: CPU threads: 1 }
  )";
  const Trace one = RunAndTrace(Parse(kResnet));
  ASSERT_EQ(one.summary.state(), topiary::v1::SUCCEEDED) << one.summary.error();
  auto two_spec = Parse(kResnet);
  two_spec.mutable_device()->set_cpu_ranks(2);
  two_spec.mutable_device()->set_sync_batch_norm(true);
  const Trace synced = RunAndTrace(two_spec);
  ASSERT_EQ(synced.summary.state(), topiary::v1::SUCCEEDED) << synced.summary.error();
  two_spec.mutable_device()->set_sync_batch_norm(false);
  const Trace apart = RunAndTrace(two_spec);
  ASSERT_EQ(apart.summary.state(), topiary::v1::SUCCEEDED) << apart.summary.error();
  ASSERT_EQ(synced.losses.size(), one.losses.size());
  double synced_gap = 0, apart_gap = 0;
  for (size_t i = 0; i < one.losses.size(); ++i) {
    synced_gap = std::max(synced_gap, std::fabs(synced.losses[i] - one.losses[i]));
    apart_gap = std::max(apart_gap, std::fabs(apart.losses[i] - one.losses[i]));
  }
  printf("largest loss gap to one rank over %zu steps: synced %.3g, not synced %.3g\n",
         one.losses.size(), synced_gap, apart_gap);
  ExpectClose(synced.losses, one.losses, 1e-3);
  EXPECT_GT(apart_gap, 10 * synced_gap);
  // The running statistics too: the evaluation (which uses them) agrees.
  EXPECT_NEAR(synced.summary.test_loss(), one.summary.test_loss(), 1e-3 * one.summary.test_loss());
}

}  // namespace
}  // namespace topiary
