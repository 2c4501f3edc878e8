// The experiment runner: turns an ExperimentSpec into a run (data, model, optimizer, the
// training loop and evaluation) and reports it as a stream of events.
//
// Deterministic on the CPU: the same spec and seed give a bit-identical loss trajectory
// (every random draw comes from a Philox stream of the seed; BLAS sums in a fixed order).
#ifndef TOPIARY_TRAINER_RUN_RUNNER_H_
#define TOPIARY_TRAINER_RUN_RUNNER_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "topiary/v1/events.pb.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/data/batcher.h"
#include "trainer/data/device_batches.h"
#include "trainer/dist/world.h"
#include "trainer/nn/model.h"
#include "trainer/run/evaluate.h"
#include "trainer/run/pruner_interface.h"

namespace topiary {

// Lets a caller (the daemon) stop a run at a step boundary and drive manual rounds. Called
// on the training thread.
class RunControl {
 public:
  enum class Stop { kNone, kPause, kCancel, kFinish };
  virtual ~RunControl() = default;
  // Polled between training steps; must be cheap. kPause: the run writes pause.h5 at this
  // step and ends with state PAUSED (resume from that checkpoint); kCancel: it ends with
  // state CANCELLED.
  virtual Stop ShouldStop() = 0;
  // With pruning.manual_rounds, called after each round (and after the dense phase) before
  // the next prune step; blocks until the client advances. It may change `next` (target,
  // step_fraction, finetune_epochs) for the rounds that follow.
  // kFinish: the client ends the rounds here; the run finishes as if the last round were
  // the last one (SUCCEEDED, its target note saying where it stopped).
  virtual Stop WaitForRound(int completed_round, topiary::v1::PruningSpec* next) = 0;
};

struct RunOptions {
  // When set: spec.textproto (with defaults), events.jsonl and summary.json are written here.
  std::string out_dir;
  // Receives every event as it happens (on the training thread).
  std::function<void(const topiary::v1::Event&)> on_event;
  // Minimum seconds between progress events (0: one per step).
  double progress_interval_s = 0.5;
  // Makes the pruning policy when the spec has a pruning block (pruning/pruner.h's
  // MakePruner; the trainer does not depend on pruning/). Required for such specs.
  PrunerFactory make_pruner;
  // Continue the run from this checkpoint of the same spec: parameters, masks, momentum
  // and position are restored, and the run goes on exactly as if it had not stopped.
  std::string resume_from;
  // Optional: pause, cancel and manual rounds.
  RunControl* control = nullptr;
  // Write events.jsonl in out_dir (the daemon keeps its own event log instead).
  bool write_event_log = true;
  // What checkpoints record as experiment_id (topiaryd: its id, e.g. "exp-0007"); empty: the
  // spec's name.
  std::string experiment_id;
  // One rank of a run of several processes (topiary worker): this process trains its share
  // of the global batch on one device; global rank 0 alone writes out_dir's files and
  // checkpoints and emits events (the others run the same loop silently, and their summary
  // says how they ended). The spec's GPU or CPU rank count must equal world.size.
  World world;
  // Seconds the processes of a world wait for each other at start.
  double rendezvous_timeout_s = 300;
};

// Checkpoints go to <out_dir>/checkpoints/: dense.h5 at the end of dense training,
// round-NNN.h5 at the end of every round, epoch-NNNN.h5 every checkpoints.every_epochs
// training epochs (the newest checkpoints.keep_last of these are kept).

// Runs `spec` (validated here; defaults filled in). Never throws; the summary's state is
// SUCCEEDED, FAILED (with the error text), PAUSED or CANCELLED, and it is also delivered as
// the last event.
topiary::v1::RunSummary RunExperiment(const topiary::v1::ExperimentSpec& spec,
                                      const RunOptions& options);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_RUNNER_H_
