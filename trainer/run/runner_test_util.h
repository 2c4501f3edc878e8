// Helpers for runner tests: parse a spec, run it, and keep the loss of every step.
#ifndef TOPIARY_TRAINER_RUN_RUNNER_TEST_UTIL_H_
#define TOPIARY_TRAINER_RUN_RUNNER_TEST_UTIL_H_

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/run/runner.h"
#include "trainer/spec/spec.h"
#include "util/test_dir.h"

namespace topiary::testing {

inline topiary::v1::ExperimentSpec Parse(const std::string& text) {
  auto spec = ParseSpec(text, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : topiary::v1::ExperimentSpec();
}

// The small run the runner, rounds and sampling tests share: resnet20 at width 0.5 on
// synthetic 12x12x2 images of 5 classes (640 to train, 320 to test), batch 32, 3 epochs at
// lr 0.05, seed 11, on 2 CPU threads. `changes` (spec text) are merged over it: a test says
// only what it is about, e.g. "train { epochs: 2 } device { kind: CUDA threads: 0 }".
inline topiary::v1::ExperimentSpec SyntheticRun(const std::string& changes = "") {
  topiary::v1::ExperimentSpec spec = Parse(R"(
    seed: 11
    model { arch: "resnet20" width: 0.5 }
    data { dataset: SYNTHETIC batch_size: 32
           synthetic { height: 12 width: 12 channels: 2 classes: 5 train_size: 640 test_size: 320 } }
    train { epochs: 3 optimizer { lr: 0.05 } }
    device { kind: CPU threads: 2 })");
  EXPECT_TRUE(google::protobuf::TextFormat::MergeFromString(changes, &spec)) << changes;
  return spec;
}

// A path under the test's temporary folder (util/test_dir.h: also outside Bazel).
inline std::string TempDir(const std::string& name) { return TestPath(name); }

struct Trace {
  std::vector<double> losses;  // one per optimizer step
  topiary::v1::RunStarted started;
  std::vector<topiary::v1::CheckpointSaved> checkpoints;
  topiary::v1::RunSummary summary;
};

// Runs `spec` with `opt` (out_dir, resume_from, ...), recording every step's loss, the
// started event and the checkpoint events; events also reach opt.on_event when set.
inline Trace RunAndTrace(const topiary::v1::ExperimentSpec& spec, RunOptions opt = {}) {
  Trace t;
  opt.progress_interval_s = 0;  // one progress event per step: the whole loss trajectory
  opt.on_event = [&t, also = opt.on_event](const topiary::v1::Event& e) {
    if (e.has_progress()) t.losses.push_back(e.progress().loss());
    if (e.has_started()) t.started = e.started();
    if (e.has_checkpoint()) t.checkpoints.push_back(e.checkpoint());
    if (also) also(e);
  };
  t.summary = RunExperiment(spec, opt);
  return t;
}

}  // namespace topiary::testing

#endif  // TOPIARY_TRAINER_RUN_RUNNER_TEST_UTIL_H_
