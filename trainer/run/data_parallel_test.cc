// Data parallelism through the runner, on CPU ranks (the same code path as GPUs, with the
// host collective instead of NCCL): ranks average to the single-rank run, repeat bit for
// bit, resume on another rank count, and refuse batches that do not split.
#include <gtest/gtest.h>

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
    ASSERT_EQ(resumed.summary.state(), topiary::v1::SUCCEEDED) << ranks << ": " << resumed.summary.error();
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

}  // namespace
}  // namespace topiary
