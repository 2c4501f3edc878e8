#include "trainer/run/runner.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/approx/approximation.h"
#include "trainer/data/dataset.h"
#include "trainer/data/device_batches.h"
#include "trainer/dist/rank_group.h"
#include "trainer/nn/channels.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/run/events.h"
#include "trainer/run/gradient_sampling.h"
#include "trainer/run/phase_trainer.h"
#include "trainer/run/round_report.h"
#include "trainer/run/run_recorder.h"
#include "trainer/spec/spec.h"
#include "trainer/store/checkpoint.h"
#include "trainer/util/file_util.h"
#include "trainer/util/json.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::Event;
using topiary::v1::ExperimentSpec;
using topiary::v1::RoundSummary;
using topiary::v1::RunSummary;

// The device of this process's one rank in a world of processes: GPU `local_rank` of those
// it sees (or its only one, where the launcher bound one GPU to each process), or a CPU
// rank. The spec's rank count must be the world's. One process: the spec's devices.
absl::StatusOr<topiary::v1::DeviceSpec> WorldDeviceSpec(const ExperimentSpec& spec,
                                                        const World& world) {
  topiary::v1::DeviceSpec d = spec.device();
  if (!world.multi()) return d;
  std::string why;
  const bool cpu = d.kind() == topiary::v1::DeviceSpec::CPU ||
                   (d.kind() == topiary::v1::DeviceSpec::AUTO && ListGpus(&why).empty());
  const int ranks = cpu ? CpuRanks(d) : RequestedGpus(d);
  if (ranks != world.size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the spec asks for %d ranks, and %d processes run it (one rank each)",
                        cpu ? "device.cpu_ranks" : "device.gpu_count", ranks, world.size));
  }
  if (spec.pruning().manual_rounds()) {
    return absl::InvalidArgumentError(
        "pruning.manual_rounds: not for runs of several processes (run it in one process)");
  }
  d.clear_cpu_ranks();
  d.clear_gpu_count();
  d.clear_gpus();
  if (cpu) {
    d.set_kind(topiary::v1::DeviceSpec::CPU);
  } else {
    const int visible = static_cast<int>(ListGpus(&why).size());
    d.add_gpus(visible > world.local_rank ? world.local_rank : 0);
  }
  return d;
}

// epoch-NNNN.h5 files in `dir` of epochs before `epoch`, oldest first.
std::vector<std::string> EarlierPeriodicCheckpoints(const std::string& dir, int epoch) {
  std::vector<std::pair<int, std::string>> found;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const absl::string_view name = e->d_name;
      int n = 0;
      if (absl::StartsWith(name, "epoch-") && absl::EndsWith(name, ".h5") &&
          absl::SimpleAtoi(name.substr(6, name.size() - 9), &n) &&
          absl::StrFormat("epoch-%04d.h5", n) == name && n < epoch) {
        found.emplace_back(n, dir + "/" + std::string(name));
      }
    }
    ::closedir(d);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [n, path] : found) out.push_back(std::move(path));
  return out;
}

// One experiment from setup to the end of its last round: the schedule (dense phase, rounds,
// manual rounds), evaluation and checkpoints. The ranks (trainer/dist/rank_group.h), the
// training of a phase (phase_trainer.h) and what the run reports (run_recorder.h) are their
// own; the position in the run is one value (RunPosition) that checkpoints save whole and
// the phase trainer alone writes.
class ExperimentRun : public PhaseHooks {
 public:
  ExperimentRun(const ExperimentSpec& spec, const RunOptions& options, RunRecorder& recorder)
      : spec_(spec), options_(options), recorder_(recorder) {}

  absl::Status Setup();
  absl::Status Execute();
  // Why Execute ended early (kNone: it did not).
  RunControl::Stop stopped() const { return stopped_; }
  int epochs_done() const { return position().epoch; }

  // PhaseHooks.
  absl::Status BeforeStep(int step_in_epoch) override;
  // The client's stop request (pause, cancel), agreed between the processes of a world.
  absl::StatusOr<RunControl::Stop> AgreedStop(int step_in_epoch);
  absl::StatusOr<EvalResult> EvaluateHeldOut() override {
    return val_data_ ? Evaluate(*val_data_, data_->validation.size(), true)
                     : Evaluate(*test_data_, data_->test.size(), false);
  }
  absl::Status PeriodicCheckpoint() override {
    return Checkpoint(absl::StrFormat("epoch-%04d.h5", position().epoch), true);
  }

 private:
  // Where the run stands (the start, before the trainer exists).
  const RunPosition& position() const {
    static const RunPosition kStart;
    return trainer_ ? trainer_->position() : kStart;
  }
  // Setup, in order.
  absl::Status SetupRanks();
  // A spec without model.arch, or a start checkpoint whose network channel pruning narrowed:
  // the network (and the input format) of the checkpoint it starts from, opened into
  // network_from_.
  absl::Status ReadCheckpointNetwork();
  // The checkpoint the run starts from: --resume's, else init_from_checkpoint (may be empty).
  const std::string& StartCheckpoint() const {
    return options_.resume_from.empty() ? spec_.init_from_checkpoint() : options_.resume_from;
  }
  absl::Status SetupData();
  absl::Status BuildModels();
  // What the spec applies to a model of rank r once built (approximate convolutions, sampled
  // weight gradients): at setup and again on each compacted network.
  absl::Status PrepareModel(int r, Model* model);
  absl::Status LoadStart();
  void EmitStarted();

  // Whether this experiment trains before its rounds (and writes a checkpoint after it):
  // from scratch, the dense phase (dense.h5); from init_from_checkpoint, train.epochs of
  // fine-tuning of that checkpoint, masks kept (finetune.h5; labelled "fine-tune", not
  // "dense"), none with train.epochs 0 (a pruning run's rounds then fine-tune; a run without
  // pruning only evaluates).
  bool TrainsDensePhase() const {
    return spec_.init_from_checkpoint().empty() || spec_.train().epochs() > 0;
  }
  topiary::v1::Phase FirstPhase() const {
    topiary::v1::Phase phase;
    if (!spec_.init_from_checkpoint().empty()) phase.set_kind(topiary::v1::Phase::START_FINE_TUNE);
    return phase;
  }
  absl::Status DensePhase();
  // The rounds until the target, max_rounds, a stall or the client (manual rounds) ends them.
  absl::Status Rounds();
  // One round: prune step with `pruner` (unless finishing a resumed round), fine-tuning,
  // evaluation, checkpoint, and the round's event.
  absl::Status Round(bool prune, Pruner* pruner = nullptr);
  // Channel pruning: every rank's network without the cut's channels, and what points into
  // the networks (training and evaluation networks, optimizers) made again.
  absl::Status Compact(const ChannelCut& cut);
  // Rank 0's evaluation network on `images` of `data`, recorded as the run's last.
  absl::StatusOr<EvalResult> Evaluate(DeviceBatches& data, int64_t images, bool validation);
  // The last evaluation of the current phase, or a new one.
  absl::StatusOr<EvalResult> LastOrNewEvaluation() {
    return last_eval_ ? absl::StatusOr<EvalResult>(*last_eval_) : EvaluateHeldOut();
  }
  // With a validation set, the test set is evaluated for the report only: this model's
  // top-1 and loss, not recorded as the run's last evaluation.
  absl::StatusOr<EvalResult> ReportTest() {
    return LeaderEvaluates(
        [&] { return topiary::Evaluate(*eval_net_, *test_data_, data_->test.size()); });
  }
  // `evaluate` on this process, or in a world of processes on global rank 0 alone, whose
  // figures every process then returns (the same decisions everywhere).
  absl::StatusOr<EvalResult> LeaderEvaluates(
      const std::function<absl::StatusOr<EvalResult>()>& evaluate);
  RoundSummary SparsityNow(int round, const std::vector<LayerPruneReport>* reports) const {
    return SparsityRow(*ranks_->model(), trainer_->Choices(), round, reports);
  }
  absl::Status Checkpoint(const std::string& name, bool periodic);
  // After the rounds: whether the pruning target was reached, and if not why (the summary's
  // target_reached and target_note).
  absl::Status NoteTarget();

  ExperimentSpec spec_;  // a copy: manual rounds may change the pruning fields
  const RunOptions& options_;
  RunRecorder& recorder_;
  std::unique_ptr<RankGroup> ranks_;
  // The start checkpoint, opened early when the spec has no model.arch (the network is the
  // file's), until LoadStart loads it.
  std::optional<CheckpointFile> network_from_;
  std::optional<Dataset> data_;
  std::optional<Batcher> train_batcher_, test_batcher_, val_batcher_;
  std::unique_ptr<PhaseTrainer> trainer_;
  std::unique_ptr<Network> eval_net_;       // rank 0's
  std::optional<DeviceBatches> test_data_;  // rank 0's
  std::optional<DeviceBatches> val_data_;   // rank 0's; data.validation_fraction's
  std::optional<EvalResult> last_eval_;     // the last evaluation of the current phase

  RunControl::Stop stopped_ = RunControl::Stop::kNone;
  bool dense_done_ = false;
  std::string parent_;
  topiary::v1::InputFormat input_;                        // what the network reads
  topiary::v1::GradientSamplingReport sampling_applied_;  // sampled gradients: what was applied
  std::vector<std::string> periodic_;  // periodic checkpoints written, oldest first
  int stalled_round_ = 0;              // the round after which no layer could progress (0: none)
  bool finished_by_client_ = false;    // manual rounds ended by the client
  int compactions_ = 0;                // channel pruning's, in this process
};

absl::Status ExperimentRun::Setup() {
  if (spec_.has_pruning() && !options_.make_pruner) {
    return absl::InternalError("pruning: this program was built without a pruning policy");
  }
  TOPIARY_RETURN_IF_ERROR(SetupRanks());
  TOPIARY_RETURN_IF_ERROR(ReadCheckpointNetwork());
  TOPIARY_RETURN_IF_ERROR(SetupData());
  TOPIARY_RETURN_IF_ERROR(BuildModels());
  TOPIARY_ASSIGN_OR_RETURN(trainer_,
                           PhaseTrainer::Create(spec_, ranks_.get(), &*train_batcher_, &recorder_));
  TOPIARY_ASSIGN_OR_RETURN(DeviceBatches test_data,
                           DeviceBatches::Create(&*test_batcher_, ranks_->device()));
  test_data_.emplace(std::move(test_data));
  TOPIARY_RETURN_IF_ERROR(test_data_->SetSequentialOrder());
  if (val_batcher_) {
    TOPIARY_ASSIGN_OR_RETURN(DeviceBatches val_data,
                             DeviceBatches::Create(&*val_batcher_, ranks_->device()));
    val_data_.emplace(std::move(val_data));
    TOPIARY_RETURN_IF_ERROR(val_data_->SetSequentialOrder());
  }
  TOPIARY_RETURN_IF_ERROR(LoadStart());
  TOPIARY_RETURN_IF_ERROR(ranks_->Replicate());  // the same start on every rank, whatever it is
  // Planned after the started event, so a client sees the run begin and then its planning.
  EmitStarted();
  TOPIARY_RETURN_IF_ERROR(trainer_->Plan());
  TOPIARY_ASSIGN_OR_RETURN(eval_net_,
                           PlanWithEvents(ranks_->model(), spec_.data().eval_batch_size(), false,
                                          PlanOptionsForSpec(spec_), ranks_->size(), &recorder_));
  return absl::OkStatus();
}

absl::Status ExperimentRun::SetupRanks() {
  const World& world = options_.world;
  TOPIARY_ASSIGN_OR_RETURN(const topiary::v1::DeviceSpec device, WorldDeviceSpec(spec_, world));
  TOPIARY_ASSIGN_OR_RETURN(auto devices, CreateDevices(device));
  TOPIARY_ASSIGN_OR_RETURN(ranks_, RankGroup::Create(std::move(devices), device.deterministic(),
                                                     world, options_.rendezvous_timeout_s));
  ranks_->device()->MakeCurrent();  // this thread is rank 0's
  recorder_.summary().set_device(
      world.multi()
          ? absl::StrFormat("%s (rank %d of %d processes)", ranks_->names(), world.rank, world.size)
          : ranks_->names());
  recorder_.set_energy(std::make_unique<BoardEnergy>(ranks_->devices(), ranks_->names()));
  if (spec_.train().precision() == topiary::v1::TrainSpec::BF16 &&
      ranks_->device()->cuda() == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "train.precision: BF16 needs a GPU, and this run's device is %s; use FP32 on the CPU",
        ranks_->device()->name()));
  }
  return absl::OkStatus();
}

absl::Status ExperimentRun::ReadCheckpointNetwork() {
  const bool resume = !options_.resume_from.empty();
  const std::string& from = StartCheckpoint();
  const std::string& arch = spec_.model().arch();
  if (!arch.empty() && from.empty()) return absl::OkStatus();
  // Read whole and checked now, so that the network is built only as large as the file's
  // weights (BuildCheckpointModel); LoadStart loads this same document.
  auto file = OpenCheckpoint(from);
  if (!file.ok()) {
    return absl::Status(
        file.status().code(),
        absl::StrCat(resume ? "--resume" : "init_from_checkpoint",
                     arch.empty() ? " (the network of a spec without model.arch)" : "", ": ",
                     file.status().message()));
  }
  if (!arch.empty()) {
    // A zoo network narrowed by channel pruning is the file's, not the zoo's.
    const auto& net = file->state.network;
    const bool compacted =
        net && std::any_of(net->layers().begin(), net->layers().end(),
                           [](const auto& l) { return l.original_out_channels() > 0; });
    if (!compacted) return absl::OkStatus();
    if (net->arch() != arch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.arch: '", arch, "', but ", from, " holds a channel-pruned '", net->arch(), "'"));
    }
  } else if (!file->state.network) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.arch: empty, and ", from,
                     " records no network (written before checkpoints did): name its "
                     "architecture, ",
                     file->state.model_arch));
  }
  network_from_ = std::move(*file);
  return absl::OkStatus();
}

absl::Status ExperimentRun::SetupData() {
  TOPIARY_ASSIGN_OR_RETURN(Dataset data, LoadDataset(spec_.data(), spec_.seed()));
  data_.emplace(std::move(data));
  const int batch = spec_.data().batch_size();
  if (data_->train.size() < batch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data.batch_size: %d exceeds the %d training images", batch, data_->train.size()));
  }
  if (data_->test.size() == 0) return absl::InvalidArgumentError("data: the test set is empty");
  TOPIARY_ASSIGN_OR_RETURN(
      const Normalization norm,
      RunNormalization(
          data_->train, data_->max_value, spec_.data().normalize(),
          network_from_ && network_from_->state.input ? &*network_from_->state.input : nullptr));
  train_batcher_.emplace(&data_->train, data_->max_value, norm, spec_.data().augment(),
                         spec_.seed());
  test_batcher_.emplace(&data_->test, data_->max_value, norm, topiary::v1::Augment{}, spec_.seed());
  if (data_->validation.size() > 0) {
    val_batcher_.emplace(&data_->validation, data_->max_value, norm, topiary::v1::Augment{},
                         spec_.seed());
  }
  input_ = DescribeInput(data_->train, data_->classes, data_->max_value, norm);
  return absl::OkStatus();
}

// Every rank builds the same model on its own device (and thread).
absl::Status ExperimentRun::BuildModels() {
  const Shape4 input{1, data_->train.batch_h(), data_->train.batch_w(), data_->train.c};
  return ranks_->Run([&](int r) -> absl::Status {
    TOPIARY_ASSIGN_OR_RETURN(
        std::unique_ptr<Model> model,
        network_from_ ? BuildCheckpointModel(network_from_->state, StartCheckpoint(), 1.0f, input,
                                             data_->classes, ranks_->device(r))
                      : BuildModel(spec_.model().arch(), spec_.model().width(), input,
                                   data_->classes, ranks_->device(r)));
    model->Initialize(spec_.seed());
    TOPIARY_RETURN_IF_ERROR(PrepareModel(r, model.get()));
    ranks_->set_model(r, std::move(model));
    return absl::OkStatus();
  });
}

absl::Status ExperimentRun::PrepareModel(int r, Model* model) {
  if (spec_.has_approximation()) {
    TOPIARY_RETURN_IF_ERROR(ApplyApproximation(spec_.approximation(), model));
  }
  if (spec_.has_gradient_sampling()) {
    TOPIARY_ASSIGN_OR_RETURN(auto applied, ApplyGradientSampling(spec_.gradient_sampling(), model));
    if (r == 0) sampling_applied_ = std::move(applied);
  }
  return absl::OkStatus();
}

absl::Status ExperimentRun::Compact(const ChannelCut& cut) {
  trainer_->Release();
  eval_net_.reset();
  TOPIARY_RETURN_IF_ERROR(ranks_->Run([&](int r) -> absl::Status {
    TOPIARY_ASSIGN_OR_RETURN(std::unique_ptr<Model> small,
                             CompactModel(*ranks_->model(r), cut.groups, cut.remove,
                                          [&](Model* m) { return PrepareModel(r, m); }));
    ranks_->set_model(r, std::move(small));
    return absl::OkStatus();
  }));
  ++compactions_;
  TOPIARY_RETURN_IF_ERROR(trainer_->Plan());
  TOPIARY_ASSIGN_OR_RETURN(eval_net_,
                           PlanWithEvents(ranks_->model(), spec_.data().eval_batch_size(), false,
                                          PlanOptionsForSpec(spec_), ranks_->size(), &recorder_));
  return absl::OkStatus();
}

// A checkpoint to start from: resume (everything) or init (weights and masks only).
absl::Status ExperimentRun::LoadStart() {
  const bool resume = !options_.resume_from.empty();
  const std::string& from = StartCheckpoint();
  if (!from.empty()) {
    auto state = network_from_ ? LoadCheckpoint(*network_from_, ranks_->model(), resume)
                               : LoadCheckpoint(from, ranks_->model(), /*with_optimizer=*/resume);
    network_from_.reset();
    if (!state.ok()) {
      return absl::Status(
          state.status().code(),
          absl::StrCat(resume ? "--resume: " : "init_from_checkpoint: ", state.status().message()));
    }
    dense_done_ = !TrainsDensePhase();
    parent_ = from;
    if (resume) {
      trainer_->Restore(state->position);
      parent_ = state->parent;
      recorder_.metrics() = state->metrics;
      dense_done_ = position().round > 0 || position().phase_epoch >= spec_.train().epochs();
    }
  }
  auto& metrics = recorder_.metrics();
  if (spec_.has_gradient_sampling() && !metrics.has_gradient_sampling()) {
    *metrics.mutable_gradient_sampling() = sampling_applied_;
  }
  return absl::OkStatus();
}

void ExperimentRun::EmitStarted() {
  Event e = recorder_.New();
  auto* s = e.mutable_started();
  s->set_name(spec_.name());
  s->set_model_arch(ranks_->model()->arch());
  s->set_device(recorder_.summary().device());
  s->set_dataset(data_->name);
  s->set_train_images(static_cast<int32_t>(data_->train.size()));
  s->set_test_images(static_cast<int32_t>(data_->test.size()));
  s->set_validation_images(static_cast<int32_t>(data_->validation.size()));
  s->set_skipped_images(static_cast<int32_t>(data_->skipped));
  for (const std::string& why : data_->skipped_examples) s->add_skipped_examples(why);
  s->set_image_decoder(trainer_->image_decoder());
  s->set_parameters(static_cast<int32_t>(ranks_->model()->trainable_parameter_count()));
  s->set_epochs(spec_.train().epochs());
  s->set_batch_size(spec_.data().batch_size());
  s->set_energy(recorder_.energy()->note());
  if (Collective* c = ranks_->collective()) {
    s->set_ranks(c->ranks());
    s->set_gradient_reduction(c->name());
  }
  if (spec_.has_gradient_sampling()) {
    *s->mutable_gradient_sampling() = recorder_.metrics().gradient_sampling();
  }
  s->set_phase(!options_.resume_from.empty() ? absl::StrFormat("resumed at round %d, epoch %d",
                                                               position().round, position().epoch)
               : !spec_.init_from_checkpoint().empty() ? "from checkpoint"
                                                       : "dense");
  recorder_.Emit(e);
}

absl::StatusOr<EvalResult> ExperimentRun::Evaluate(DeviceBatches& data, int64_t images,
                                                   bool validation) {
  TOPIARY_ASSIGN_OR_RETURN(EvalResult r, LeaderEvaluates([&]() -> absl::StatusOr<EvalResult> {
                             BoardEnergy& energy = *recorder_.energy();
                             TOPIARY_ASSIGN_OR_RETURN(const double joules_start, energy.Joules());
                             TOPIARY_ASSIGN_OR_RETURN(EvalResult r,
                                                      topiary::Evaluate(*eval_net_, data, images));
                             TOPIARY_ASSIGN_OR_RETURN(const double joules_end, energy.Joules());
                             if (joules_start >= 0 && joules_end >= 0 && r.images > 0) {
                               r.joules_per_image = (joules_end - joules_start) / r.images;
                             }
                             return r;
                           }));
  r.validation = validation;
  recorder_.RecordEvaluation(r);
  last_eval_ = r;
  return r;
}

absl::StatusOr<EvalResult> ExperimentRun::LeaderEvaluates(
    const std::function<absl::StatusOr<EvalResult>()>& evaluate) {
  if (!ranks_->world().multi()) return evaluate();
  // Every process must take part in the exchange, the leader's failure included: its
  // status travels with the figures.
  absl::StatusOr<EvalResult> mine = ranks_->leads() ? evaluate() : EvalResult{};
  double figures[6] = {};
  if (ranks_->leads() && mine.ok()) {
    figures[0] = 1;
    figures[1] = mine->loss, figures[2] = mine->top1, figures[3] = mine->top5;
    figures[4] = static_cast<double>(mine->images), figures[5] = mine->joules_per_image;
  }
  std::vector<double> all(6 * static_cast<size_t>(ranks_->world_size()));
  TOPIARY_RETURN_IF_ERROR(
      ranks_->collective()->ExchangeHost(0, figures, sizeof(figures), all.data()));
  if (ranks_->leads()) return mine;
  if (all[0] != 1) return absl::AbortedError("rank 0's evaluation failed (its log says why)");
  EvalResult r;
  r.loss = all[1], r.top1 = all[2], r.top5 = all[3];
  r.images = static_cast<int64_t>(all[4]), r.joules_per_image = all[5];
  return r;
}

absl::Status ExperimentRun::NoteTarget() {
  TOPIARY_ASSIGN_OR_RETURN(auto pruner,
                           options_.make_pruner(spec_.pruning(), ranks_->model(), spec_.seed()));
  RunSummary& summary = recorder_.summary();
  const std::string unmet = pruner->unmet_target();
  summary.set_target_reached(pruner->finished() && unmet.empty());
  if (summary.target_reached()) return absl::OkStatus();
  if (!unmet.empty()) {
    summary.set_target_note(absl::StrFormat("%s after %d round(s)", unmet, position().round));
    return absl::OkStatus();
  }
  const auto& rounds = recorder_.metrics().rounds();
  const std::string why =
      stalled_round_ > 0 ? "no layer below its target could gain a zero"
      : finished_by_client_
          ? "the client ended the rounds (topiary round --finish)"
          : absl::StrFormat("max_rounds (%d) ended the rounds", spec_.pruning().max_rounds());
  summary.set_target_note(TargetNote(spec_.pruning(), rounds[rounds.size() - 1],
                                     SparsityNow(position().round, nullptr), position().round,
                                     why));
  return absl::OkStatus();
}

absl::Status ExperimentRun::Checkpoint(const std::string& name, bool periodic) {
  // Rank 0 writes; every other rank must hold the same model, bit for bit (checked on every
  // process of a world, where only the leader has an out_dir).
  TOPIARY_RETURN_IF_ERROR(ranks_->CheckIdentical(name));
  if (options_.out_dir.empty()) return absl::OkStatus();
  const std::string dir = options_.out_dir + "/checkpoints";
  TOPIARY_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string path = dir + "/" + name;
  auto& metrics = recorder_.metrics();
  metrics.set_sparsity(SparsityNow(position().round, nullptr).sparsity());
  metrics.set_train_joules_per_image(recorder_.energy()->train_joules_per_image());
  CheckpointState state;
  state.experiment_id = options_.experiment_id.empty() ? spec_.name() : options_.experiment_id;
  state.parent = parent_;
  state.spec_text = SpecToText(spec_);
  state.position = position();
  state.seed = spec_.seed();
  state.metrics = metrics;
  state.input = input_;
  TOPIARY_RETURN_IF_ERROR(SaveCheckpoint(path, *ranks_->model(), state));
  recorder_.summary().set_checkpoint(path);
  Event e = recorder_.New();
  auto* c = e.mutable_checkpoint();
  c->set_path(path);
  c->set_round(position().round);
  c->set_epoch(position().epoch);
  if (ranks_->world_size() > 1) c->set_ranks_identical(ranks_->world_size());
  recorder_.Emit(e);
  if (periodic) {
    // The periodic checkpoints of earlier starts of this run (before a pause, a restart)
    // count towards keep_last too.
    if (periodic_.empty()) periodic_ = EarlierPeriodicCheckpoints(dir, position().epoch);
    periodic_.push_back(path);
    const int keep = spec_.checkpoints().keep_last();
    while (keep > 0 && static_cast<int>(periodic_.size()) > keep) {
      std::remove(periodic_.front().c_str());
      periodic_.erase(periodic_.begin());
    }
  }
  return absl::OkStatus();
}

absl::Status ExperimentRun::BeforeStep(int step_in_epoch) {
  TOPIARY_ASSIGN_OR_RETURN(const RunControl::Stop stop, AgreedStop(step_in_epoch));
  if (stop == RunControl::Stop::kNone) return absl::OkStatus();
  stopped_ = stop;
  if (stop == RunControl::Stop::kPause) {
    TOPIARY_RETURN_IF_ERROR(Checkpoint("pause.h5", false));  // at step_in_epoch
  }
  return absl::AbortedError(stop == RunControl::Stop::kPause ? "paused" : "cancelled");
}

absl::StatusOr<RunControl::Stop> ExperimentRun::AgreedStop(int step_in_epoch) {
  RunControl::Stop stop =
      options_.control != nullptr ? options_.control->ShouldStop() : RunControl::Stop::kNone;
  if (!ranks_->world().multi()) return stop;
  // The processes agree every kStopCheckSteps steps (an exchange between steps costs the GPU
  // its queue of launched work): the strongest request of any process wins, and all stop
  // before the same step.
  constexpr int kStopCheckSteps = 16;
  if (step_in_epoch % kStopCheckSteps != 0) return RunControl::Stop::kNone;
  const int32_t mine = static_cast<int32_t>(stop);
  std::vector<int32_t> all(ranks_->world_size());
  TOPIARY_RETURN_IF_ERROR(ranks_->collective()->ExchangeHost(0, &mine, sizeof(mine), all.data()));
  int32_t agreed = 0;
  for (int32_t s : all) agreed = std::max(agreed, s);
  return static_cast<RunControl::Stop>(agreed);
}

absl::Status ExperimentRun::Round(bool prune, Pruner* pruner) {
  const auto& pr = spec_.pruning();
  topiary::v1::LrSchedule cosine;
  cosine.set_kind(topiary::v1::LrSchedule::COSINE);
  const std::vector<float> finetune_lr =
      trainer_->LrTable(cosine, pr.finetune_lr(), pr.finetune_epochs());
  const RunClock::time_point start = RunClock::now();
  std::vector<LayerPruneReport> reports;
  if (prune) {
    trainer_->BeginRound();
    GradientStats grads;
    if (pruner->needs_gradients()) {
      TOPIARY_ASSIGN_OR_RETURN(grads, trainer_->GradientStatistics());
    }
    TOPIARY_ASSIGN_OR_RETURN(
        reports, pruner->Step(position().round, pruner->needs_gradients() ? &grads : nullptr));
    if (std::optional<ChannelCut> cut = pruner->TakeChannelCut()) {
      TOPIARY_RETURN_IF_ERROR(Compact(*cut));
    }
    TOPIARY_RETURN_IF_ERROR(ranks_->Replicate());  // rank 0 pruned: the same masks everywhere
  }
  last_eval_.reset();
  TOPIARY_RETURN_IF_ERROR(
      trainer_->Train(FineTunePhase(position().round), pr.finetune_epochs(), finetune_lr, *this));
  TOPIARY_ASSIGN_OR_RETURN(const EvalResult r, LastOrNewEvaluation());
  auto& metrics = recorder_.metrics();
  RoundSummary* row = metrics.add_rounds();
  *row = SparsityNow(position().round, prune ? &reports : nullptr);
  if (position().round == 1 && pruner != nullptr) {
    for (const std::string& why : pruner->dense_layers()) row->add_dense_layers(why);
  }
  if (prune) {
    for (auto& g : pruner->channel_groups()) *row->add_channel_groups() = std::move(g);
  }
  row->set_step_seconds(trainer_->phase_step_seconds());
  SetEvalFigures(r, row);
  row->set_seconds(SecondsSince(start));
  TOPIARY_RETURN_IF_ERROR(Checkpoint(absl::StrFormat("round-%03d.h5", position().round), false));
  row = metrics.mutable_rounds(metrics.rounds_size() - 1);
  row->set_checkpoint(recorder_.summary().checkpoint());
  Event e = recorder_.New();
  *e.mutable_round() = *row;
  recorder_.Emit(e);
  return absl::OkStatus();
}

// The dense phase (unless done or skipped), then round 0: the dense model, trained here or
// loaded by init_from_checkpoint.
absl::Status ExperimentRun::DensePhase() {
  const RunClock::time_point start = RunClock::now();
  if (!dense_done_) {
    const auto& t = spec_.train();
    last_eval_.reset();
    TOPIARY_RETURN_IF_ERROR(
        trainer_->Train(FirstPhase(), t.epochs(),
                        trainer_->LrTable(t.lr_schedule(), t.optimizer().lr(), t.epochs()), *this));
  }
  auto& metrics = recorder_.metrics();
  if (position().round > 0 || metrics.rounds_size() > 0) return absl::OkStatus();
  TOPIARY_ASSIGN_OR_RETURN(const EvalResult r, LastOrNewEvaluation());
  RoundSummary row0 = SparsityNow(0, nullptr);
  if (!dense_done_) row0.set_step_seconds(trainer_->phase_step_seconds());
  SetEvalFigures(r, &row0);
  if (r.validation && spec_.has_pruning()) {
    // The dense model's test top-1, for the report's accuracy drop (nothing selects on it).
    TOPIARY_ASSIGN_OR_RETURN(const EvalResult test, ReportTest());
    SetEvalFigures(test, &row0);
  }
  metrics.set_dense_top1(r.validation ? row0.test_top1() : r.top1);
  RoundSummary* row = metrics.add_rounds();
  *row = std::move(row0);
  row->set_seconds(SecondsSince(start));
  trainer_->EndDensePhase();
  if (TrainsDensePhase()) {
    TOPIARY_RETURN_IF_ERROR(
        Checkpoint(spec_.init_from_checkpoint().empty() ? "dense.h5" : "finetune.h5", false));
    metrics.mutable_rounds(0)->set_checkpoint(recorder_.summary().checkpoint());
  }
  if (spec_.has_pruning()) {
    Event e = recorder_.New();
    *e.mutable_round() = metrics.rounds(0);
    recorder_.Emit(e);
  }
  return absl::OkStatus();
}

absl::Status ExperimentRun::Rounds() {
  const auto& metrics = recorder_.metrics();
  // A resumed run may have stopped inside a round's fine-tuning: finish that round first.
  if (position().round > 0 && metrics.rounds_size() <= position().round) {
    TOPIARY_RETURN_IF_ERROR(Round(/*prune=*/false));
  }
  // One pruner for the rounds, so that finished() can keep its promise (its layers remember
  // whether their last step stalled); made again only when a manual round changes the spec.
  auto make = [&] { return options_.make_pruner(spec_.pruning(), ranks_->model(), spec_.seed()); };
  TOPIARY_ASSIGN_OR_RETURN(std::unique_ptr<Pruner> pruner, make());
  while (position().round < spec_.pruning().max_rounds() && !pruner->finished()) {
    if (spec_.pruning().manual_rounds() && options_.control != nullptr) {
      const RunControl::Stop stop =
          options_.control->WaitForRound(position().round, spec_.mutable_pruning());
      if (stop == RunControl::Stop::kFinish) {  // the client ends the rounds here
        finished_by_client_ = true;
        break;
      }
      if (stop != RunControl::Stop::kNone) {
        stopped_ = stop;  // the last round's checkpoint is where a resume continues
        return absl::AbortedError("stopped while waiting for a round");
      }
      TOPIARY_ASSIGN_OR_RETURN(pruner, make());
    }
    const int compactions = compactions_;
    TOPIARY_RETURN_IF_ERROR(Round(/*prune=*/true, pruner.get()));
    // A pruner serves one network: the compacted one gets its own (which knows from the
    // network's widths whether it is finished).
    if (compactions_ != compactions) {
      TOPIARY_ASSIGN_OR_RETURN(pruner, make());
    }
    // Every layer at its target or unable to add a zero: more rounds would only repeat this
    // one. When some layer stalled, the target note says the rounds ended there.
    if (pruner->finished() && metrics.rounds(metrics.rounds_size() - 1).layers_stalled() > 0) {
      stalled_round_ = position().round;
    }
  }
  return NoteTarget();
}

absl::Status ExperimentRun::Execute() {
  TOPIARY_RETURN_IF_ERROR(DensePhase());
  if (spec_.has_pruning()) TOPIARY_RETURN_IF_ERROR(Rounds());
  if (val_data_) {  // the final report: the test set's one evaluation of the final model
    TOPIARY_ASSIGN_OR_RETURN(EvalResult test, ReportTest());
    recorder_.RecordEvaluation(test);
    if (!spec_.has_pruning()) recorder_.metrics().set_dense_top1(test.top1);
  }
  recorder_.Finish(position().epoch, SparsityNow(position().round, nullptr).sparsity(),
                   trainer_->images_per_s());
  return absl::OkStatus();
}

}  // namespace

RunSummary RunExperiment(const ExperimentSpec& raw_spec, const RunOptions& given) {
  const RunClock::time_point start = RunClock::now();
  RunOptions options = given;
  if (options.world.rank != 0) {  // only global rank 0 writes files and emits events
    options.out_dir.clear();
    options.on_event = nullptr;
  }
  absl::Status status = ValidateSpec(raw_spec);
  const ExperimentSpec spec = WithDefaults(raw_spec);
  if (status.ok() && !options.out_dir.empty()) {
    status = MakeDirs(options.out_dir);
    if (!status.ok())
      status = absl::PermissionDeniedError(absl::StrCat("--out: ", status.message()));
    if (status.ok())
      status = WriteFileAtomic(options.out_dir + "/spec.textproto", SpecToText(spec));
  }
  RunRecorder recorder(options, spec, start);
  RunSummary& summary = recorder.summary();
  if (status.ok()) {
    ExperimentRun run(spec, options, recorder);
    // Nothing below throws by design; a failed allocation in a library (std::bad_alloc)
    // still must not take a daemon down with it, so it becomes the run's error.
    try {
      status = run.Setup();
      if (status.ok()) status = run.Execute();
    } catch (const std::exception& e) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the run stopped on an exception (", e.what(),
                       "): probably out of host memory for this model, batch or dataset"));
    }
    if (run.stopped() != RunControl::Stop::kNone) {
      summary.set_epochs(run.epochs_done());
      summary.set_state(run.stopped() == RunControl::Stop::kPause ? topiary::v1::PAUSED
                                                                  : topiary::v1::CANCELLED);
      status = absl::OkStatus();
    }
  }
  if (summary.state() == topiary::v1::STATE_UNSPECIFIED) {
    summary.set_state(status.ok() ? topiary::v1::SUCCEEDED : topiary::v1::FAILED);
  }
  if (!status.ok()) summary.set_error(std::string(status.message()));
  summary.set_seconds(SecondsSince(start));
  Event e = recorder.New();
  *e.mutable_summary() = summary;
  recorder.Emit(e);
  if (!options.out_dir.empty() && IsDirectory(options.out_dir)) {
    (void)WriteFileAtomic(options.out_dir + "/summary.json", ToJson(summary) + "\n");
  }
  return summary;
}

}  // namespace topiary
