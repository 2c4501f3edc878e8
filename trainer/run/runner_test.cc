#include "trainer/run/runner.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "trainer/run/runner_test_util.h"
#include "trainer/spec/spec.h"
#include "trainer/util/file_util.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

using testing::Parse;
using testing::RunAndTrace;
using testing::SyntheticRun;
using testing::Trace;

topiary::v1::ExperimentSpec Synthetic() {
  return SyntheticRun(R"(
    data { augment { crop_padding: 1 horizontal_flip: true } }
    train { lr_schedule { kind: COSINE warmup_epochs: 0.5 } })");
}

TEST(Runner, SameSpecAndSeedGiveBitIdenticalLosses) {
  const auto spec = Synthetic();
  const Trace a = RunAndTrace(spec), b = RunAndTrace(spec);
  ASSERT_EQ(a.summary.state(), topiary::v1::SUCCEEDED) << a.summary.error();
  ASSERT_EQ(a.losses.size(), 60u);  // 3 epochs x 20 steps
  EXPECT_EQ(a.losses, b.losses);    // exact equality, not a tolerance
  auto other = spec;
  other.set_seed(12);
  EXPECT_NE(RunAndTrace(other).losses, a.losses);
}

// Pauses at the n-th step boundary it is asked about.
class PauseAt : public RunControl {
 public:
  explicit PauseAt(int n) : left_(n) {}
  Stop ShouldStop() override { return --left_ == 0 ? Stop::kPause : Stop::kNone; }
  Stop WaitForRound(int, topiary::v1::PruningSpec*) override { return Stop::kNone; }

 private:
  int left_;
};

// keep_last counts the periodic checkpoints of earlier starts of the run too: a run paused
// and resumed (or restarted by the daemon) used to forget them and keep them forever.
TEST(Runner, KeepLastCountsCheckpointsFromBeforeAPause) {
  auto spec = Synthetic();
  spec.mutable_train()->set_epochs(5);
  spec.mutable_checkpoints()->set_every_epochs(1);
  spec.mutable_checkpoints()->set_keep_last(2);
  RunOptions options;
  options.out_dir = testing::TestPath("keep_last");
  PauseAt pause(50);  // in epoch 3, after epoch-0001.h5 and epoch-0002.h5
  options.control = &pause;
  const auto first = RunExperiment(spec, options);
  ASSERT_EQ(first.state(), topiary::v1::PAUSED) << first.error();
  RunOptions again;
  again.out_dir = options.out_dir;
  again.resume_from = first.checkpoint();
  const auto s = RunExperiment(spec, again);
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  std::vector<std::string> periodic;
  for (int e = 1; e <= 5; ++e) {
    const std::string name = absl::StrFormat("epoch-%04d.h5", e);
    if (PathExists(options.out_dir + "/checkpoints/" + name)) periodic.push_back(name);
  }
  // The newest two (the last epoch ends the run without one); 0001 and 0002, written before
  // the pause, are gone.
  EXPECT_EQ(periodic, (std::vector<std::string>{"epoch-0003.h5", "epoch-0004.h5"}));
}

TEST(Runner, LearnsSyntheticClasses) {
  // Without augmentation: the random-blob prototypes are not flip- or shift-invariant, so
  // flips can make one class look like another.
  auto spec = Synthetic();
  spec.mutable_data()->clear_augment();
  const Trace t = RunAndTrace(spec);
  ASSERT_EQ(t.summary.state(), topiary::v1::SUCCEEDED) << t.summary.error();
  EXPECT_GT(t.summary.test_top1(), 0.9) << "synthetic prototypes are easy to separate";
  EXPECT_LT(t.losses.back(), t.losses.front());
  EXPECT_EQ(t.summary.epochs(), 3);
  EXPECT_GT(t.summary.train_images_per_s(), 0);
  // Activation sparsity of every convolution's input: the stem reads the normalized image
  // (hardly any exact zeros), the others post-ReLU activations (many).
  ASSERT_GT(t.summary.conv_input_sparsity_size(), 10);
  EXPECT_EQ(t.summary.conv_input_sparsity(0).layer(), "stem.conv");
  EXPECT_LT(t.summary.conv_input_sparsity(0).zero_fraction(), 0.01);
  for (int i = 1; i < t.summary.conv_input_sparsity_size(); ++i) {
    const auto& l = t.summary.conv_input_sparsity(i);
    EXPECT_GT(l.zero_fraction(), 0.1) << l.layer();
    EXPECT_LT(l.zero_fraction(), 1.0) << l.layer();
  }
  // No board energy counter on the CPU: no figures, and none invented.
  EXPECT_EQ(t.summary.train_joules_per_image(), 0);
  EXPECT_EQ(t.summary.test_joules_per_image(), 0);
}

TEST(Runner, SaysOnceWhyThereAreNoEnergyFigures) {
  auto spec = Synthetic();
  spec.mutable_train()->set_epochs(1);
  std::vector<std::string> notes;
  RunOptions opt;
  opt.on_event = [&](const topiary::v1::Event& e) {
    if (e.has_started()) notes.push_back(e.started().energy());
    if (e.has_epoch()) {
      EXPECT_EQ(e.epoch().train_joules_per_image(), 0);
    }
  };
  const auto summary = RunExperiment(spec, opt);
  ASSERT_EQ(summary.state(), topiary::v1::SUCCEEDED) << summary.error();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("no energy figures on the CPU"), std::string::npos) << notes[0];
}

TEST(Runner, LenetLearnsFashionMnistSubset) {
  const Trace t = RunAndTrace(Parse(R"(
    seed: 3 model { arch: "lenet5" }
    data { batch_size: 64 train_limit: 6000 test_limit: 2000 }
    train { epochs: 2 optimizer { lr: 0.05 nesterov: true } }
    device { kind: CPU })"));
  ASSERT_EQ(t.summary.state(), topiary::v1::SUCCEEDED) << t.summary.error();
  EXPECT_GT(t.summary.test_top1(), 0.75);
  EXPECT_GT(t.summary.test_top5(), t.summary.test_top1());
}

TEST(Runner, FailuresAreReportedNotThrown) {
  auto spec = Synthetic();
  spec.mutable_data()->set_batch_size(10000);
  auto s = RunAndTrace(spec).summary;
  EXPECT_EQ(s.state(), topiary::v1::FAILED);
  EXPECT_EQ(s.error(), "data.batch_size: 10000 exceeds the 640 training images");
  spec = Synthetic();
  spec.mutable_device()->set_kind(topiary::v1::DeviceSpec::CUDA);
  s = RunAndTrace(spec).summary;
  EXPECT_EQ(s.state(), topiary::v1::FAILED);
  EXPECT_NE(s.error().find("device.kind: CUDA"), std::string::npos) << s.error();
  spec = Synthetic();
  spec.mutable_train()->set_precision(topiary::v1::TrainSpec::BF16);
  s = RunAndTrace(spec).summary;
  EXPECT_EQ(s.state(), topiary::v1::FAILED);
  EXPECT_NE(s.error().find("train.precision: BF16 needs a GPU"), std::string::npos) << s.error();
  spec = Synthetic();
  spec.mutable_train()->mutable_optimizer()->set_lr(1000.0f);  // the largest lr validation allows
  spec.mutable_train()->mutable_optimizer()->set_weight_decay(1.0f);
  s = RunAndTrace(spec).summary;
  EXPECT_EQ(s.state(), topiary::v1::FAILED);
  EXPECT_NE(s.error().find("diverged"), std::string::npos) << s.error();
}

}  // namespace
}  // namespace topiary
