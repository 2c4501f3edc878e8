// RunRecorder: what a run reports, in one place. It numbers the run's events and hands them
// to the caller's callback, events.jsonl and TensorBoard; it holds the summary that the run
// returns and the metrics that its checkpoints carry; and it reads the GPU boards' energy
// counters. The runner and the phase trainer write to it; nothing reads events back.
#ifndef TOPIARY_TRAINER_RUN_RUN_RECORDER_H_
#define TOPIARY_TRAINER_RUN_RUN_RECORDER_H_

#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/checkpoint.pb.h"
#include "topiary/v1/events.pb.h"
#include "trainer/core/device.h"
#include "trainer/core/energy.h"
#include "trainer/run/runner.h"
#include "trainer/run/tensorboard.h"

namespace topiary {

using RunClock = std::chrono::steady_clock;

// Seconds since `since`.
double SecondsSince(RunClock::time_point since);

// The GPU boards' energy counters of a run's ranks. Figures need every rank's counter (their
// sum): with one missing there are none, and note() says why.
class BoardEnergy {
 public:
  // `names`: the devices as the run names them (RankGroup::names()).
  BoardEnergy(const std::vector<Device*>& devices, const std::string& names);
  const std::string& note() const { return note_; }
  // The counters summed after waiting for the devices, or -1 without counters.
  absl::StatusOr<double> Joules();
  // Joules and images of a training epoch measured by two Joules() readings (either < 0:
  // not measured); the epoch's joules per image, or 0.
  double AddTraining(double start, double end, int64_t images);
  double train_joules_per_image() const { return images_ > 0 ? joules_ / images_ : 0; }

 private:
  std::vector<Device*> devices_;
  std::vector<std::unique_ptr<EnergyMeter>> meters_;
  std::string note_;
  double joules_ = 0;
  int64_t images_ = 0;
};

class RunRecorder {
 public:
  RunRecorder(const RunOptions& options, const topiary::v1::ExperimentSpec& spec,
              RunClock::time_point start);

  // A new event, numbered and timed; Emit delivers it.
  topiary::v1::Event New();
  void Emit(const topiary::v1::Event& e);
  double progress_interval_s() const { return options_.progress_interval_s; }

  topiary::v1::RunSummary& summary() { return summary_; }
  topiary::v1::CheckpointMetrics& metrics() { return metrics_; }
  // Set once the devices exist; null before.
  BoardEnergy* energy() { return energy_.get(); }
  void set_energy(std::unique_ptr<BoardEnergy> energy) { energy_ = std::move(energy); }

  // An evaluation (of the test set, or of the validation set), into the summary and the
  // metrics.
  void RecordEvaluation(const EvalResult& r);
  // Before the last event: the figures of the whole run into the summary.
  void Finish(int epochs, double sparsity, double train_images_per_s);

 private:
  const RunOptions& options_;
  RunClock::time_point start_;
  std::ofstream file_;
  std::optional<TensorBoardWriter> tensorboard_;
  uint32_t seq_ = 0;
  topiary::v1::RunSummary summary_;
  topiary::v1::CheckpointMetrics metrics_;  // with the gradient sampling report and its counts
  std::unique_ptr<BoardEnergy> energy_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_RUN_RECORDER_H_
