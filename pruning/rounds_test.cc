// Pruning runs end to end on the CPU: rounds until every layer reaches its target, masked
// checkpoints, exact resumption, init_from_checkpoint.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "pruning/rounds_test_util.h"
#include "trainer/run/runner_test_util.h"

namespace topiary {
namespace {

using testing::CheckMaskedCheckpoint;
using testing::OutDir;
using testing::Parse;
using testing::PruningOptions;
using testing::RunWithLosses;
using testing::StepLosses;
using testing::SyntheticRun;

// resnet20 at half width (8, 16, 32 channels) with 4 x 4 blocks: every conv but the stem is
// eligible (the stem has 2 input channels: one input block).
constexpr char kRounds[] = R"(
  name: "rounds" seed: 5
  data { synthetic { train_size: 320 test_size: 160 } }
  train { epochs: 2 }
  pruning { block_in: 4 block_out: 4 target: 0.5 step_fraction: 0.5 finetune_epochs: 1 }
  checkpoints { every_epochs: 1 }
)";

TEST(Rounds, BlockPruningReachesTheTargetKeepingEveryRule) {
  const StepLosses a = RunWithLosses(SyntheticRun(kRounds), PruningOptions(OutDir("block")));
  const auto& s = a.summary;
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  ASSERT_GE(s.rounds_size(), 3);  // round 0 (dense) and at least two prune steps
  const auto& last = s.rounds(s.rounds_size() - 1);
  EXPECT_EQ(last.layers_pruned(), 20);
  EXPECT_EQ(last.layers_at_target(), 20);
  EXPECT_LE(s.rounds_size() - 1, 13);
  for (const auto& layer : last.layers()) EXPECT_NE(layer.layer(), "stem.conv");
  EXPECT_EQ(s.epochs(), 2 + (s.rounds_size() - 1));
  EXPECT_GT(s.dense_top1(), 0.3);
  const testing::MaskCheck check = CheckMaskedCheckpoint(s.checkpoint(), 0.5);
  EXPECT_EQ(check.masked_layers, 20);
  EXPECT_EQ(check.block_layers_at_target, 20);
  // Sparsity only grows from round to round.
  for (int i = 1; i < s.rounds_size(); ++i) {
    EXPECT_GE(s.rounds(i).sparsity(), s.rounds(i - 1).sparsity());
  }
}

// data.validation_fraction: epochs and rounds are judged on held-out training images; the
// test set is evaluated for the dense model (the drop's base) and the final model only.
TEST(Rounds, AValidationSetJudgesTheRoundsAndTheTestSetReportsTheEnd) {
  auto spec = SyntheticRun(kRounds);
  spec.mutable_data()->set_validation_fraction(0.2f);
  RunOptions options = PruningOptions(OutDir("validation"));
  topiary::v1::RunStarted started;
  int val_epochs = 0, test_epochs = 0;
  options.on_event = [&](const topiary::v1::Event& e) {
    if (e.has_started()) started = e.started();
    if (e.has_epoch() && e.epoch().evaluated()) {
      ++(e.epoch().val_loss() > 0 ? val_epochs : test_epochs);
    }
  };
  const auto s = RunExperiment(spec, options);
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  // 20% of each class's share of the 320 training images, rounded per class.
  EXPECT_NEAR(started.validation_images(), 64, 3);
  EXPECT_EQ(started.train_images() + started.validation_images(), 320);
  EXPECT_EQ(started.test_images(), 160);
  EXPECT_EQ(test_epochs, 0);
  EXPECT_EQ(val_epochs, s.epochs());
  ASSERT_GE(s.rounds_size(), 3);
  // Round 0: the dense model on both sets; after it, the validation set alone.
  EXPECT_GT(s.rounds(0).val_loss(), 0);
  EXPECT_GT(s.rounds(0).test_loss(), 0);
  EXPECT_EQ(s.dense_top1(), s.rounds(0).test_top1());
  for (int i = 1; i < s.rounds_size(); ++i) {
    EXPECT_GT(s.rounds(i).val_loss(), 0) << "round " << i;
    EXPECT_EQ(s.rounds(i).test_loss(), 0) << "round " << i;
  }
  // The final report: the test set's evaluation of the final model, and its validation top-1.
  EXPECT_GT(s.test_loss(), 0);
  EXPECT_GT(s.test_top1(), 0);
  EXPECT_EQ(s.val_top1(), s.rounds(s.rounds_size() - 1).val_top1());
  // The checkpoints record the validation figures they were judged by.
  auto ckpt = ReadCheckpointState(s.checkpoint());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->metrics.val_top1(), s.val_top1());
  EXPECT_EQ(ckpt->metrics.test_top1(), 0);
}

TEST(Rounds, ResumedRunsContinueBitIdentically) {
  const auto spec = SyntheticRun(kRounds);
  const std::string dir = OutDir("full");
  const StepLosses full = RunWithLosses(spec, PruningOptions(dir));
  ASSERT_EQ(full.summary.state(), topiary::v1::SUCCEEDED) << full.summary.error();
  // From inside the dense phase (after epoch 1 of 2) and from the end of round 1.
  for (const char* from : {"epoch-0001.h5", "round-001.h5"}) {
    RunOptions options = PruningOptions(OutDir(std::string("resumed-") + from));
    options.resume_from = dir + "/checkpoints/" + from;
    const StepLosses resumed = RunWithLosses(spec, options);
    ASSERT_EQ(resumed.summary.state(), topiary::v1::SUCCEEDED) << resumed.summary.error();
    ASSERT_FALSE(resumed.loss.empty());
    const int first = resumed.loss.begin()->first;
    EXPECT_GT(first, 1) << from;
    for (const auto& [step, loss] : resumed.loss) {
      ASSERT_EQ(full.loss.count(step), 1u) << from << " step " << step;
      ASSERT_EQ(loss, full.loss.at(step)) << from << " step " << step;  // exact
    }
    EXPECT_EQ(resumed.loss.size(), full.loss.size() - (first - 1)) << from;
    ASSERT_EQ(resumed.summary.rounds_size(), full.summary.rounds_size()) << from;
    for (int i = 0; i < full.summary.rounds_size(); ++i) {
      EXPECT_EQ(resumed.summary.rounds(i).test_top1(), full.summary.rounds(i).test_top1());
      EXPECT_EQ(resumed.summary.rounds(i).sparsity(), full.summary.rounds(i).sparsity());
    }
    EXPECT_EQ(resumed.summary.test_loss(), full.summary.test_loss()) << from;
  }
}

// Pauses at the n-th step boundary it is asked about, or cancels.
class StopAt : public RunControl {
 public:
  StopAt(int n, Stop how) : left_(n), how_(how) {}
  Stop ShouldStop() override { return --left_ == 0 ? how_ : Stop::kNone; }
  Stop WaitForRound(int, topiary::v1::PruningSpec*) override { return Stop::kNone; }

 private:
  int left_;
  Stop how_;
};

// Data parallelism on CPU ranks: rank 0 prunes (with gradient scores, so the step reads the
// averaged gradients of both ranks), every rank installs the same masks, and every
// checkpoint is written only after the ranks were compared bit for bit. A pause on two
// ranks resumes on one and still reaches the target.
TEST(Rounds, DataParallelPruningKeepsRanksIdentical) {
  auto spec = SyntheticRun(kRounds);
  spec.mutable_device()->set_cpu_ranks(2);
  spec.mutable_pruning()->set_score(topiary::v1::PruningSpec::GRAD_L2);
  std::vector<int> identical;
  RunOptions options = PruningOptions(OutDir("dp"));
  StopAt pause(27, RunControl::Stop::kPause);  // inside round 1
  options.control = &pause;
  options.on_event = [&](const topiary::v1::Event& e) {
    if (e.has_checkpoint()) identical.push_back(e.checkpoint().ranks_identical());
  };
  const auto first = RunExperiment(spec, options);
  ASSERT_EQ(first.state(), topiary::v1::PAUSED) << first.error();
  spec.mutable_device()->set_cpu_ranks(1);
  RunOptions again = PruningOptions(OutDir("dp"));
  again.resume_from = first.checkpoint();
  const auto s = RunExperiment(spec, again);
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  ASSERT_GE(identical.size(), 3u);  // epoch-0001, dense, round-001... and pause.h5
  for (int n : identical) EXPECT_EQ(n, 2);
  const auto& last = s.rounds(s.rounds_size() - 1);
  EXPECT_EQ(last.layers_at_target(), 20);
  const testing::MaskCheck check = CheckMaskedCheckpoint(s.checkpoint(), 0.5);
  EXPECT_EQ(check.block_layers_at_target, 20);
}

TEST(Rounds, PausedRunsResumeMidEpochBitIdentically) {
  const auto spec = SyntheticRun(kRounds);
  const StepLosses full = RunWithLosses(spec, PruningOptions(OutDir("nopause")));
  ASSERT_EQ(full.summary.state(), topiary::v1::SUCCEEDED) << full.summary.error();
  // 10 steps per epoch: step 15 is inside the second dense epoch; step 27 inside round 1.
  for (int at : {15, 27}) {
    const std::string dir = OutDir("paused" + std::to_string(at));
    StopAt pause(at, RunControl::Stop::kPause);
    RunOptions options = PruningOptions(dir);
    options.control = &pause;
    const StepLosses first = RunWithLosses(spec, options);
    ASSERT_EQ(first.summary.state(), topiary::v1::PAUSED) << first.summary.error();
    EXPECT_EQ(first.summary.checkpoint(), dir + "/checkpoints/pause.h5");
    EXPECT_EQ(first.loss.rbegin()->first, at - 1);
    RunOptions again = PruningOptions(dir);
    again.resume_from = first.summary.checkpoint();
    const StepLosses second = RunWithLosses(spec, again);
    ASSERT_EQ(second.summary.state(), topiary::v1::SUCCEEDED) << second.summary.error();
    EXPECT_EQ(second.loss.begin()->first, at);
    std::map<int, double> joined = first.loss;
    joined.insert(second.loss.begin(), second.loss.end());
    EXPECT_EQ(joined, full.loss) << "paused at step " << at;
    EXPECT_EQ(second.summary.test_loss(), full.summary.test_loss());
  }
  StopAt cancel(5, RunControl::Stop::kCancel);
  RunOptions options = PruningOptions(OutDir("cancelled"));
  options.control = &cancel;
  EXPECT_EQ(RunWithLosses(spec, options).summary.state(), topiary::v1::CANCELLED);
}

// Advances manual rounds, raising the target after the first round.
class ManualRounds : public RunControl {
 public:
  Stop ShouldStop() override { return Stop::kNone; }
  Stop WaitForRound(int completed, topiary::v1::PruningSpec* next) override {
    seen.push_back(completed);
    if (completed == 1) next->set_target(0.75f);
    return Stop::kNone;
  }
  std::vector<int> seen;
};

TEST(Rounds, ManualRoundsWaitAfterEachRoundAndTakeChanges) {
  auto spec = SyntheticRun(kRounds);
  spec.mutable_pruning()->set_manual_rounds(true);
  ManualRounds control;
  RunOptions options = PruningOptions(OutDir("manual"));
  options.control = &control;
  const StepLosses r = RunWithLosses(spec, options);
  ASSERT_EQ(r.summary.state(), topiary::v1::SUCCEEDED) << r.summary.error();
  ASSERT_GE(control.seen.size(), 3u);
  EXPECT_EQ(control.seen[0], 0);  // after the dense phase
  EXPECT_EQ(control.seen[1], 1);
  EXPECT_GT(r.summary.sparsity(), 0.7) << "the raised target was applied";
}

TEST(Rounds, InitFromCheckpointSkipsTheDensePhaseAndKeepsMasks) {
  const std::string dir = OutDir("parent");
  const StepLosses parent = RunWithLosses(SyntheticRun(kRounds), PruningOptions(dir));
  ASSERT_EQ(parent.summary.state(), topiary::v1::SUCCEEDED) << parent.summary.error();
  auto spec = SyntheticRun(kRounds);
  spec.set_init_from_checkpoint(dir + "/checkpoints/round-001.h5");
  spec.mutable_pruning()->set_target(0.75f);
  spec.mutable_train()->set_epochs(0);  // as a fork sets it: the parent did the dense phase
  const StepLosses child = RunWithLosses(spec, PruningOptions(OutDir("child")));
  ASSERT_EQ(child.summary.state(), topiary::v1::SUCCEEDED) << child.summary.error();
  EXPECT_EQ(child.summary.rounds(0).sparsity(), parent.summary.rounds(1).sparsity())
      << "round 0 of the child is the parent's round-1 model, masks included";
  EXPECT_EQ(child.summary.epochs(), child.summary.rounds_size() - 1) << "no dense epochs";
  auto file = OpenCheckpoint(child.summary.checkpoint());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->state.parent, dir + "/checkpoints/round-001.h5");
  CheckMaskedCheckpoint(child.summary.checkpoint(), 0.75);
}

TEST(Rounds, GradientWeightedScoresAndPerLayerMagnitudeReachTheirTargets) {
  auto spec = SyntheticRun(kRounds);
  spec.mutable_pruning()->set_score(topiary::v1::PruningSpec::GRAD_L2);
  const StepLosses grad = RunWithLosses(spec, PruningOptions(OutDir("grad")));
  ASSERT_EQ(grad.summary.state(), topiary::v1::SUCCEEDED) << grad.summary.error();
  const auto& last = grad.summary.rounds(grad.summary.rounds_size() - 1);
  EXPECT_EQ(last.layers_at_target(), 20);
  EXPECT_EQ(CheckMaskedCheckpoint(grad.summary.checkpoint(), 0.5).block_layers_at_target, 20);

  spec = SyntheticRun(kRounds);
  spec.mutable_pruning()->set_method(topiary::v1::PruningSpec::MAGNITUDE);
  spec.mutable_pruning()->add_overrides()->set_layer("fc");
  spec.mutable_pruning()->mutable_overrides(0)->set_exclude(true);
  const StepLosses mag = RunWithLosses(spec, PruningOptions(OutDir("magnitude")));
  ASSERT_EQ(mag.summary.state(), topiary::v1::SUCCEEDED) << mag.summary.error();
  const auto& m = mag.summary.rounds(mag.summary.rounds_size() - 1);
  EXPECT_EQ(m.layers_pruned(), 21);  // every conv, the stem included; not the excluded fc
  EXPECT_EQ(m.layers_at_target(), 21);
  for (const auto& layer : m.layers()) {
    EXPECT_NE(layer.layer(), "fc");
    EXPECT_NEAR(layer.sparsity(), 0.5, 0.01) << layer.layer();
  }
  EXPECT_EQ(CheckMaskedCheckpoint(mag.summary.checkpoint(), 0.5).masked_layers, 21);
}

TEST(Rounds, BadCheckpointsAreRefusedNamingTheField) {
  auto spec = SyntheticRun(kRounds);
  spec.set_init_from_checkpoint(OutDir("nope.h5"));
  const StepLosses r = RunWithLosses(spec, PruningOptions(OutDir("bad")));
  EXPECT_EQ(r.summary.state(), topiary::v1::FAILED);
  EXPECT_NE(r.summary.error().find("init_from_checkpoint: "), std::string::npos)
      << r.summary.error();
  EXPECT_NE(r.summary.error().find("no such file"), std::string::npos) << r.summary.error();
}

}  // namespace
}  // namespace topiary

namespace topiary {
namespace {

// Rounds stop once no layer below its target can gain a zero (the block rules cap them),
// and the summary says the target was not reached, why, and which layers fell short; they
// used to go on to max_rounds and end as if the target had been met.
TEST(Rounds, StopWhenNoLayerCanProgressAndSayTheTargetWasMissed) {
  auto spec = testing::SyntheticRun(kRounds);
  spec.mutable_train()->set_epochs(1);
  spec.mutable_pruning()->set_target(0.99f);
  spec.mutable_pruning()->set_step_fraction(1.0f);
  spec.mutable_pruning()->set_max_rounds(8);
  spec.clear_checkpoints();
  const auto s = RunExperiment(spec, PruningOptions(""));
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  EXPECT_LT(s.rounds_size() - 1, 8) << "rounds went on after every layer had stalled";
  EXPECT_GT(s.rounds(s.rounds_size() - 1).layers_stalled(), 0);
  EXPECT_FALSE(s.target_reached());
  EXPECT_NE(s.target_note().find("target 99.0% not reached: no layer below its target could "
                                 "gain a zero"),
            std::string::npos)
      << s.target_note();
  EXPECT_NE(s.target_note().find("short of their target: "), std::string::npos);
  // A reachable target is reported reached, without a note.
  spec.mutable_pruning()->set_target(0.3f);
  const auto ok = RunExperiment(spec, PruningOptions(""));
  ASSERT_EQ(ok.state(), topiary::v1::SUCCEEDED) << ok.error();
  EXPECT_TRUE(ok.target_reached());
  EXPECT_EQ(ok.target_note(), "");
}

}  // namespace
}  // namespace topiary
