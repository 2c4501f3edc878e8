// PhaseTrainer: trains the ranks' models through a phase (the dense phase, or a round's
// fine-tuning) epoch by epoch. It owns what a training step touches on every rank (the
// training network, optimizer, device batches and gradient reducer), the steps captured as
// CUDA graphs, the learning-rate tables and the sampled-gradient schedule; it reports
// progress and epochs to the RunRecorder and advances the RunPosition. The runner decides
// which phases run (trainer/run/runner.cc).
#ifndef TOPIARY_TRAINER_RUN_PHASE_TRAINER_H_
#define TOPIARY_TRAINER_RUN_PHASE_TRAINER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/data/batcher.h"
#include "trainer/data/device_batches.h"
#include "trainer/dist/gradient_sync.h"
#include "trainer/dist/rank_group.h"
#include "trainer/nn/model.h"
#include "trainer/optim/optimizer.h"
#include "trainer/run/evaluate.h"
#include "trainer/run/gradient_sampling.h"
#include "trainer/run/pruner_interface.h"
#include "trainer/run/round_report.h"
#include "trainer/run/run_recorder.h"
#include "trainer/store/checkpoint.h"

namespace topiary {

// What a phase asks of the run at its boundaries.
class PhaseHooks {
 public:
  virtual ~PhaseHooks() = default;
  // Before each step (step_in_epoch: steps done in this epoch, as the position says). An
  // error (ABORTED when the run pauses or is cancelled) ends the phase.
  virtual absl::Status BeforeStep(int step_in_epoch) = 0;
  // Evaluates the held-out images (at the end of an epoch that evaluates): the validation
  // set when the spec holds one out, else the test set.
  virtual absl::StatusOr<EvalResult> EvaluateHeldOut() = 0;
  // Writes the periodic checkpoint of the position (between epochs).
  virtual absl::Status PeriodicCheckpoint() = 0;
};

// Plans a network of `model` for `batch`, sending Planning events as it goes and when it is
// done (`ranks` > 1: the name says the batch is per rank).
absl::StatusOr<std::unique_ptr<Network>> PlanWithEvents(Model* model, int batch, bool training,
                                                        const PlanOptions& options, int ranks,
                                                        RunRecorder* recorder);

class PhaseTrainer {
 public:
  // `spec` (the run's, which manual rounds may change), `ranks` (models built), `batcher`
  // (the training set) and `recorder` outlive the trainer.
  static absl::StatusOr<std::unique_ptr<PhaseTrainer>> Create(
      const topiary::v1::ExperimentSpec& spec, RankGroup* ranks, Batcher* batcher,
      RunRecorder* recorder);

  // Where the run stands. The trainer is its one writer: the epochs and steps it trains, and
  // the run's transitions below, so the position a checkpoint saves is always one it made.
  const RunPosition& position() const { return position_; }
  // A resumed run continues from its checkpoint's position.
  void Restore(const RunPosition& at) { position_ = at; }
  // A prune step: the fine-tuning of the next round starts at its first epoch.
  void BeginRound() {
    ++position_.round;
    position_.phase_epoch = 0;
  }
  // The dense phase is over: trained here, or skipped (the model came from a checkpoint).
  void EndDensePhase() { position_.phase_epoch = spec_.train().epochs(); }

  // Makes the optimizers and plans the training networks: rank 0's with planning events, the
  // other ranks' from the plan cache's memory of rank 0's choices; and the gradient reducers
  // between ranks.
  absl::Status Plan();
  // Drops what Plan made, which points into the ranks' models: before the models are
  // replaced (channel pruning's compaction), after which Plan makes them again.
  void Release();

  int steps_per_epoch() const { return steps_per_epoch_; }
  // The learning rate of every step of a phase of `epochs` epochs.
  std::vector<float> LrTable(const topiary::v1::LrSchedule& schedule, double base_lr,
                             int epochs) const;
  // Trains `epochs` epochs of `phase` from the position's phase_epoch (and epoch_step, when a
  // paused run resumes inside an epoch), with `lr_table` for the phase's steps.
  absl::Status Train(const topiary::v1::Phase& phase, int epochs,
                     const std::vector<float>& lr_table, PhaseHooks& hooks);
  // Mean |dW| of every prunable kernel over a few training batches (GRAD_L2 scores). Batch
  // norm running statistics are restored afterwards, so the model is as it was.
  absl::StatusOr<GradientStats> GradientStatistics();
  // The training network's measured dispatch of block-sparse convolutions (rank 0's).
  SparseConvChoices Choices() const { return ranks_[0].net->SparseConvChoices(); }
  // How rank 0's training batches are decoded (streamed image folders); empty otherwise.
  std::string image_decoder() const { return ranks_[0].data->decoder(); }
  // Images trained per second over every phase so far.
  double images_per_s() const { return seconds_ > 0 ? images_ / seconds_ : 0; }
  // Mean seconds per training step of the last Train call (0: it trained no step).
  double phase_step_seconds() const { return phase_step_seconds_; }

 private:
  // What a training step touches on one rank.
  struct RankState {
    std::unique_ptr<Network> net;
    std::optional<SgdOptimizer> optimizer;
    std::optional<DeviceBatches> data;
    std::unique_ptr<GradientSync> sync;
    std::unique_ptr<kernels::BatchNormSync> batch_norm_sync;  // device.sync_batch_norm
  };
  struct Phase;  // one call of Train: its clocks, steps and figures

  PhaseTrainer(const topiary::v1::ExperimentSpec& spec, RankGroup* ranks, Batcher* batcher,
               RunRecorder* recorder);
  absl::Status Epoch(Phase& phase, PhaseHooks& hooks);
  // Every progress interval (and at the epoch's last step): reads the metrics and sends a
  // Progress event. Waits for the devices, so not every step.
  absl::Status ReportProgress(Phase& phase, int step, bool last);
  absl::Status EndEpoch(Phase& phase, PhaseHooks& hooks);
  // The training networks' metrics since the last call, summed over the ranks.
  absl::StatusOr<Metrics> TakeMetrics();

  const topiary::v1::ExperimentSpec& spec_;
  RankGroup* group_;
  Batcher* batcher_;
  RunRecorder* recorder_;
  RunPosition position_;
  std::vector<RankState> ranks_;
  int batch_ = 0;        // the global batch
  int local_batch_ = 0;  // each rank's share of it
  int steps_per_epoch_ = 0;
  std::optional<SamplingPolicy> sampling_;  // which steps sample weight gradients
  double seconds_ = 0;
  int64_t images_ = 0;
  double phase_step_seconds_ = 0;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_PHASE_TRAINER_H_
