#include "trainer/run/runner.h"

#include <google/protobuf/util/json_util.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/approx/approximation.h"
#include "trainer/core/energy.h"
#include "trainer/data/dataset.h"
#include "trainer/dist/collective.h"
#include "trainer/dist/gradient_sync.h"
#include "trainer/dist/rank_threads.h"
#include "trainer/dist/replicate.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/nn/plan_cache.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/optim/optimizer.h"
#include "trainer/run/device_batches.h"
#include "trainer/run/events.h"
#include "trainer/run/gradient_sampling.h"
#include "trainer/run/step_runner.h"
#include "trainer/run/tensorboard.h"
#include "trainer/spec/spec.h"
#include "trainer/store/checkpoint.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::CheckpointMetrics;
using topiary::v1::Event;
using topiary::v1::ExperimentSpec;
using topiary::v1::LayerSparsity;
using topiary::v1::RoundSummary;
using topiary::v1::RunSummary;
using Clock = std::chrono::steady_clock;

// Numbers events and hands them to the callback and the events file.
class EventSink {
 public:
  EventSink(const RunOptions& options, Clock::time_point start) : options_(options), start_(start) {
    if (!options.out_dir.empty() && options.write_event_log) {
      file_.open(options.out_dir + "/events.jsonl", std::ios::trunc);
    }
    // TensorBoard files beside the checkpoints: `tensorboard --logdir OUT_DIR` (topiaryd:
    // DATA_DIR/experiments shows every experiment).
    if (!options.out_dir.empty()) tensorboard_.emplace(options.out_dir + "/tensorboard");
  }
  Event New() {
    Event e;
    e.set_seq(++seq_);
    e.set_time_s(std::chrono::duration<double>(Clock::now() - start_).count());
    return e;
  }
  double progress_interval_s() const { return options_.progress_interval_s; }
  void Emit(const Event& e) {
    if (file_.is_open()) file_ << EventToJsonLine(e) << "\n" << std::flush;
    if (tensorboard_) tensorboard_->Write(e);
    if (options_.on_event) options_.on_event(e);
  }

 private:
  const RunOptions& options_;
  Clock::time_point start_;
  std::ofstream file_;
  std::optional<TensorBoardWriter> tensorboard_;
  uint32_t seq_ = 0;
};

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

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// One experiment from setup to the end of its last round. Position in the run (round,
// epochs, steps) is kept here and in checkpoints, so a resumed run continues exactly.
class ExperimentRun {
 public:
  ExperimentRun(const ExperimentSpec& spec, const RunOptions& options, EventSink& sink,
                RunSummary* summary)
      : spec_(spec), options_(options), sink_(sink), summary_(summary) {}

  absl::Status Setup();
  absl::Status Execute();
  // Why Execute ended early (kNone: it did not).
  RunControl::Stop stopped() const { return stopped_; }

 private:
  // Trains `epochs` epochs of the phase `phase`, starting at its epoch phase_epoch_, with
  // `lr_table` giving the learning rate of every step of the phase.
  absl::Status TrainPhase(const std::string& phase, int epochs, const std::vector<float>& lr_table);
  absl::StatusOr<EvalResult> EvaluateTest();
  // Whether this experiment trains a dense phase (and writes dense.h5 after it): always
  // from scratch; from init_from_checkpoint, a pruning run skips it (its rounds fine-tune)
  // and a run without pruning trains train.epochs (fine-tuning, e.g. with approximation;
  // 0 only evaluates).
  bool TrainsDensePhase() const {
    return spec_.init_from_checkpoint().empty() ||
           (!spec_.has_pruning() && spec_.train().epochs() > 0);
  }
  // Mean |dW| of every prunable kernel over a few training batches (GRAD_L2 scores). Batch
  // norm running statistics are restored afterwards, so the model is as it was.
  absl::StatusOr<GradientStats> GradientStatistics();
  // Sparsity of every conv and linear kernel; `reports` adds the step's targets and flags.
  RoundSummary SparsityRow(int round, const std::vector<LayerPruneReport>* reports) const;
  absl::Status Checkpoint(const std::string& name, bool periodic);
  // One round: prune step with `pruner` (unless finishing a resumed round), fine-tuning,
  // evaluation, checkpoint, and the round's event.
  absl::Status Round(bool prune, Pruner* pruner = nullptr);
  std::vector<float> LrTable(const topiary::v1::LrSchedule& schedule, double base_lr,
                             int epochs) const;
  // Plans a network for `batch`, sending Planning events as it goes and when it is done.
  absl::StatusOr<std::unique_ptr<Network>> PlanWithEvents(int batch, bool training);

  // Stops the run at the current step when the control asks: pause writes pause.h5 there.
  // Returns an error (ABORTED) that unwinds Execute when it stops.
  absl::Status CheckStop(int step_in_epoch);
  // After the rounds: whether the pruning target was reached, and if not why the rounds
  // ended and which layers fell short (the summary's target_reached and target_note).
  absl::Status NoteTarget();

  ExperimentSpec spec_;  // a copy: manual rounds may change the pruning fields
  const RunOptions& options_;
  EventSink& sink_;
  RunSummary* summary_;

  // One data-parallel rank: its device and everything a training step touches there. Rank
  // 0's model is the run's: it is loaded, evaluated, pruned and checkpointed, and the other
  // ranks copy it after each change (trainer/dist/replicate.h). One rank: no threads, no
  // collective.
  struct Rank {
    std::unique_ptr<Device> device;
    std::unique_ptr<Model> model;
    std::unique_ptr<Network> train_net;
    std::optional<SgdOptimizer> optimizer;
    std::optional<DeviceBatches> train_data;
    std::unique_ptr<GradientSync> sync;
  };
  Device* device() const { return ranks_[0].device.get(); }
  Model* model() const { return ranks_[0].model.get(); }
  // Runs fn(rank) on every rank's thread at once.
  absl::Status OnRanks(const std::function<absl::Status(int)>& fn) { return threads_->Run(fn); }
  // Rank 0's parameters, momentum and masks copied to the other ranks.
  absl::Status Replicate();
  // The training networks' metrics since the last call, summed over the ranks.
  absl::StatusOr<Metrics> TakeTrainMetrics();
  PlanOptions PlanOptionsForSpec() const;

  std::vector<Rank> ranks_;
  std::unique_ptr<Collective> collective_;  // more than one rank only
  std::unique_ptr<RankThreads> threads_;
  std::optional<Dataset> data_;
  std::unique_ptr<Network> eval_net_;  // rank 0's
  std::optional<Batcher> train_batcher_, test_batcher_;
  std::optional<DeviceBatches> test_data_;  // rank 0's
  int batch_ = 0;                           // the global batch
  int local_batch_ = 0;                     // each rank's share of it
  int steps_per_epoch_ = 0;

  // Position of the run.
  int round_ = 0;
  int epoch_ = 0;        // training epochs completed, all phases
  int phase_epoch_ = 0;  // epochs completed in the current phase
  int epoch_step_ = 0;   // steps completed in the epoch under way (resuming a paused run)
  RunControl::Stop stopped_ = RunControl::Stop::kNone;
  int64_t global_step_ = 0;
  bool dense_done_ = false;
  std::string parent_;
  std::string input_json_;     // topiary.v1.InputFormat: what the network reads
  CheckpointMetrics metrics_;  // with the gradient sampling report and its step counts
  // Sampled weight gradients: which steps sample (absent: none), and what was applied.
  std::optional<SamplingPolicy> sampling_;
  topiary::v1::GradientSamplingReport sampling_applied_;
  std::vector<std::string> periodic_;  // periodic checkpoints written, oldest first
  int stalled_round_ = 0;  // the round after which no layer could progress (0: none)
  double train_seconds_ = 0;
  int64_t images_trained_ = 0;
  std::optional<EvalResult> last_eval_;  // the last evaluation of the current phase
  // The GPU boards' energy counters, one per rank (empty: none; energy_note_ says why), and
  // the joules and images of the training epochs measured so far.
  std::vector<std::unique_ptr<EnergyMeter>> energy_;
  std::string energy_note_;
  double train_joules_ = 0;
  int64_t energy_images_ = 0;
  // The boards' counters summed after waiting for the devices, or -1 without counters.
  absl::StatusOr<double> Joules();
  double TrainJoulesPerImage() const {
    return energy_images_ > 0 ? train_joules_ / energy_images_ : 0;
  }
};

absl::Status ExperimentRun::Setup() {
  if (spec_.has_pruning() && !options_.make_pruner) {
    return absl::InternalError("pruning: this program was built without a pruning policy");
  }
  auto devices = CreateDevices(spec_.device());
  if (!devices.ok()) return devices.status();
  std::vector<Device*> raw;
  std::vector<std::string> names;
  for (auto& d : *devices) {
    raw.push_back(d.get());
    names.push_back(d->name());
    ranks_.emplace_back().device = std::move(d);
  }
  device()->MakeCurrent();  // this thread is rank 0's
  summary_->set_device(absl::StrJoin(names, ", "));
  if (ranks_.size() > 1) {
    if (device()->cuda() != nullptr) {
      auto nccl = MakeNcclCollective(raw, spec_.device().deterministic());
      if (!nccl.ok()) return nccl.status();
      collective_ = std::move(*nccl);
    } else {
      collective_ = MakeHostCollective(static_cast<int>(ranks_.size()));
    }
  }
  threads_ = std::make_unique<RankThreads>(raw, [this] {
    if (collective_) collective_->Abort();
  });
  // Energy figures need every rank's board counter (their sum); one missing: none.
  energy_note_ = absl::StrCat("NVML board energy counter", raw.size() > 1 ? "s" : "", " of ",
                              absl::StrJoin(names, ", "));
  for (Device* d : raw) {
    auto meter = EnergyMeter::ForDevice(*d);
    if (!meter.ok()) {
      energy_.clear();
      energy_note_ = std::string(meter.status().message());
      break;
    }
    energy_.push_back(std::move(*meter));
  }
  if (spec_.train().precision() == topiary::v1::TrainSpec::BF16 && device()->cuda() == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "train.precision: BF16 needs a GPU, and this run's device is %s; use FP32 on the CPU",
        device()->name()));
  }

  auto data = LoadDataset(spec_.data(), spec_.seed());
  if (!data.ok()) return data.status();
  data_.emplace(std::move(*data));
  batch_ = spec_.data().batch_size();
  local_batch_ = batch_ / static_cast<int>(ranks_.size());  // ValidateSpec: it divides
  if (data_->train.size() < batch_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data.batch_size: %d exceeds the %d training images", batch_, data_->train.size()));
  }
  if (data_->test.size() == 0) return absl::InvalidArgumentError("data: the test set is empty");

  const Normalization norm =
      ComputeNormalization(data_->train, data_->max_value, spec_.data().normalize());
  train_batcher_.emplace(&data_->train, data_->max_value, norm, spec_.data().augment(),
                         spec_.seed());
  test_batcher_.emplace(&data_->test, data_->max_value, norm, topiary::v1::Augment{}, spec_.seed());
  input_json_ = MessageToJson(DescribeInput(data_->train, data_->classes, data_->max_value, norm));
  steps_per_epoch_ = static_cast<int>(data_->train.size() / batch_);
  if (spec_.has_gradient_sampling()) sampling_.emplace(spec_.gradient_sampling(), spec_.seed());

  // Every rank builds the same model on its own device (and thread).
  const Shape4 input{1, data_->train.h, data_->train.w, data_->train.c};
  TOPIARY_RETURN_IF_ERROR(OnRanks([&](int r) -> absl::Status {
    Rank& rank = ranks_[r];
    auto model = BuildModel(spec_.model().arch(), spec_.model().width(), input, data_->classes,
                            rank.device.get());
    if (!model.ok()) return model.status();
    rank.model = std::move(*model);
    rank.model->Initialize(spec_.seed());
    if (spec_.has_approximation()) {
      TOPIARY_RETURN_IF_ERROR(ApplyApproximation(spec_.approximation(), rank.model.get()));
    }
    if (spec_.has_gradient_sampling()) {
      auto applied = ApplyGradientSampling(spec_.gradient_sampling(), rank.model.get());
      if (!applied.ok()) return applied.status();
      if (r == 0) sampling_applied_ = std::move(*applied);
    }
    rank.optimizer.emplace(rank.model->parameters(), spec_.train().optimizer(), rank.device.get());
    auto train_data = DeviceBatches::Create(&*train_batcher_, rank.device.get());
    if (!train_data.ok()) return train_data.status();
    rank.train_data.emplace(std::move(*train_data));
    return absl::OkStatus();
  }));
  auto test_data = DeviceBatches::Create(&*test_batcher_, device());
  if (!test_data.ok()) return test_data.status();
  test_data_.emplace(std::move(*test_data));
  TOPIARY_RETURN_IF_ERROR(test_data_->SetSequentialOrder());

  // A checkpoint to start from: resume (everything) or init (weights and masks only).
  const std::string& from =
      options_.resume_from.empty() ? spec_.init_from_checkpoint() : options_.resume_from;
  if (!from.empty()) {
    const bool resume = !options_.resume_from.empty();
    auto state = LoadCheckpoint(from, model(), /*with_optimizer=*/resume);
    if (!state.ok()) {
      return absl::Status(
          state.status().code(),
          absl::StrCat(resume ? "--resume: " : "init_from_checkpoint: ", state.status().message()));
    }
    dense_done_ = !TrainsDensePhase();
    if (resume) {
      round_ = state->round;
      epoch_ = state->epoch;
      phase_epoch_ = state->phase_epoch;
      epoch_step_ = state->epoch_step;
      global_step_ = state->global_step - state->epoch_step;  // at the start of the epoch
      parent_ = state->parent;
      if (!state->metrics_json.empty()) {
        (void)google::protobuf::util::JsonStringToMessage(state->metrics_json, &metrics_);
      }
      dense_done_ = round_ > 0 || phase_epoch_ >= spec_.train().epochs();
    } else {
      parent_ = from;
    }
  }
  TOPIARY_RETURN_IF_ERROR(Replicate());  // the same start on every rank, whatever it is

  Event e = sink_.New();
  auto* s = e.mutable_started();
  s->set_name(spec_.name());
  s->set_model_arch(spec_.model().arch());
  s->set_device(summary_->device());
  s->set_dataset(data_->name);
  s->set_train_images(static_cast<int32_t>(data_->train.size()));
  s->set_test_images(static_cast<int32_t>(data_->test.size()));
  s->set_parameters(static_cast<int32_t>(model()->trainable_parameter_count()));
  s->set_epochs(spec_.train().epochs());
  s->set_batch_size(batch_);
  s->set_energy(energy_note_);
  if (collective_) {
    s->set_ranks(collective_->ranks());
    s->set_gradient_reduction(collective_->name());
  }
  if (sampling_ && !metrics_.has_gradient_sampling()) {
    *metrics_.mutable_gradient_sampling() = sampling_applied_;
  }
  if (sampling_) *s->mutable_gradient_sampling() = metrics_.gradient_sampling();
  s->set_phase(!options_.resume_from.empty()
                   ? absl::StrFormat("resumed at round %d, epoch %d", round_, epoch_)
               : !spec_.init_from_checkpoint().empty() ? "from checkpoint"
                                                       : "dense");
  sink_.Emit(e);
  // Planned after the started event, so a client sees the run begin and then its planning.
  auto train_net = PlanWithEvents(local_batch_, true);
  if (!train_net.ok()) return train_net.status();
  ranks_[0].train_net = std::move(*train_net);
  // The other ranks plan the same shapes: rank 0's choices, from the plan cache's memory.
  TOPIARY_RETURN_IF_ERROR(OnRanks([&](int r) -> absl::Status {
    Rank& rank = ranks_[r];
    if (r > 0) {
      auto net = Network::Plan(rank.model.get(), local_batch_, true, PlanOptionsForSpec());
      if (!net.ok()) return net.status();
      rank.train_net = std::move(*net);
    }
    if (!collective_) return absl::OkStatus();
    auto sync = GradientSync::Create(rank.model.get(), collective_.get(), r,
                                     rank.train_net->dtype() == kernels::DType::kBf16);
    if (!sync.ok()) return sync.status();
    rank.sync = std::move(*sync);
    rank.train_net->set_gradient_reducer(rank.sync.get());
    return absl::OkStatus();
  }));
  auto eval_net = PlanWithEvents(spec_.data().eval_batch_size(), false);
  if (!eval_net.ok()) return eval_net.status();
  eval_net_ = std::move(*eval_net);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Network>> ExperimentRun::PlanWithEvents(int batch, bool training) {
  std::string name = absl::StrFormat("%s, batch %d", training ? "training" : "evaluation", batch);
  if (training && ranks_.size() > 1) absl::StrAppend(&name, " per rank, ", ranks_.size(), " ranks");
  Clock::time_point last = Clock::now();
  auto fill = [&](const PlanProgress& p, topiary::v1::Planning* out) {
    out->set_network(name);
    out->set_layers_done(p.layers_done);
    out->set_layers_total(p.layers_total);
    out->set_convolutions_cached(p.convs_cached);
    out->set_convolutions_measured(p.convs_measured);
    out->set_convolutions_untimed(p.convs_untimed);
    out->set_seconds(p.seconds);
  };
  PlanOptions options = PlanOptionsForSpec();
  options.progress = [&](const PlanProgress& p) {
    if (Seconds(last) < sink_.progress_interval_s()) return;
    last = Clock::now();
    Event e = sink_.New();
    fill(p, e.mutable_planning());
    sink_.Emit(e);
  };
  auto net = Network::Plan(model(), batch, training, options);
  if (!net.ok()) return net.status();
  Event e = sink_.New();
  auto* done = e.mutable_planning();
  fill((*net)->plan_progress(), done);
  done->set_done(true);
  done->set_planned_bytes(static_cast<int64_t>((*net)->planned_bytes()));
  if (training && device()->cuda() != nullptr) {
    const ConvPlanCache& cache = ConvPlanCache::Global();
    for (const std::string& f : cache.files()) done->add_cache_files(f);
    for (const std::string& n : cache.notes()) done->add_cache_notes(n);
  }
  sink_.Emit(e);
  return net;
}

std::vector<float> ExperimentRun::LrTable(const topiary::v1::LrSchedule& schedule, double base_lr,
                                          int epochs) const {
  // Evaluated at the end of each step so that a warm-up never uses a rate of exactly zero.
  std::vector<float> table(static_cast<size_t>(epochs) * steps_per_epoch_);
  for (size_t t = 0; t < table.size(); ++t) {
    table[t] =
        static_cast<float>(LearningRate(schedule, base_lr, (t + 1.0) / steps_per_epoch_, epochs));
  }
  return table;
}

absl::Status ExperimentRun::TrainPhase(const std::string& phase, int epochs,
                                       const std::vector<float>& lr_table) {
  std::vector<TrainingClock> clocks;  // per rank
  for (Rank& rank : ranks_) {
    auto clock = TrainingClock::Create(rank.device.get(), lr_table);
    if (!clock.ok()) return clock.status();
    clocks.push_back(std::move(*clock));
  }
  const float smoothing = spec_.train().label_smoothing();
  const bool augment = train_batcher_->augments();
  // One training step of rank r, enqueued; everything that varies per step is read from the
  // clock. Rank r takes its share of the global batch, at offset r * local_batch_.
  auto step_fn = [&](int r) -> absl::Status {
    Rank& rank = ranks_[r];
    Network& net = *rank.train_net;
    TrainingClock& clock = clocks[r];
    TOPIARY_RETURN_IF_ERROR(clock.Tick(batch_));
    TOPIARY_RETURN_IF_ERROR(
        rank.train_data->Assemble(clock.clock(), 0, static_cast<int64_t>(r) * local_batch_,
                                  local_batch_, augment, net.input(), net.labels()));
    TOPIARY_RETURN_IF_ERROR(net.Forward(true));
    TOPIARY_RETURN_IF_ERROR(net.Loss(smoothing));
    TOPIARY_RETURN_IF_ERROR(net.Backward());  // averages the ranks' gradients
    return rank.optimizer->Step(clock.clock());
  };
  // On a GPU the step is captured as a CUDA graph after one eager step and replayed. Each
  // phase captures anew: a prune step may have added mask buffers. A step that samples weight
  // gradients enqueues other kernels than an exact one: each kind has its own graph.
  const bool graphs = spec_.device().cuda_graphs() != topiary::v1::DeviceSpec::GRAPHS_OFF;
  auto step_kind = [&](int r, bool sample) -> std::function<absl::Status()> {
    return [&, r, sample]() {
      SetSampling(ranks_[r].model.get(), sample);
      return step_fn(r);
    };
  };
  std::vector<StepRunner> exact_steps, sampled_steps;  // per rank
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    Device* d = ranks_[r].device.get();
    exact_steps.emplace_back(d, step_kind(r, false), graphs, /*eager_steps=*/1);
    sampled_steps.emplace_back(d, step_kind(r, true), graphs, /*eager_steps=*/1);
  }
  // Made once: a std::function built per step would allocate on the host every step.
  const std::function<absl::Status(int)> run_exact = [&](int r) { return exact_steps[r].Run(); };
  const std::function<absl::Status(int)> run_sampled = [&](int r) {
    return sampled_steps[r].Run();
  };
  const double phase_start_seconds = train_seconds_;
  last_eval_.reset();
  for (; phase_epoch_ < epochs; ++phase_epoch_) {
    const int epoch = phase_epoch_;
    const Clock::time_point epoch_start = Clock::now();
    const std::vector<int32_t> order = train_batcher_->EpochOrder(epoch_);
    const int first_step = epoch_step_;  // non-zero once, when resuming a paused run
    epoch_step_ = 0;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      TOPIARY_RETURN_IF_ERROR(ranks_[r].train_data->SetOrder(order));
      TOPIARY_RETURN_IF_ERROR(
          clocks[r].BeginEpoch(epoch_, static_cast<int64_t>(epoch) * steps_per_epoch_, first_step));
    }
    Metrics epoch_metrics;
    int sampled_in_epoch = 0;
    auto joules_start = Joules();
    if (!joules_start.ok()) return joules_start.status();
    Clock::time_point last_progress = Clock::now();
    for (int step = first_step; step < steps_per_epoch_; ++step) {
      TOPIARY_RETURN_IF_ERROR(CheckStop(step));
      const bool sample = sampling_ && sampling_->Samples(epoch_, step, global_step_ + step);
      TOPIARY_RETURN_IF_ERROR(OnRanks(sample ? run_sampled : run_exact));
      if (sampling_) {
        auto* counts = metrics_.mutable_gradient_sampling();
        if (sample) {
          counts->set_sampled_steps(counts->sampled_steps() + 1);
          ++sampled_in_epoch;
        } else {
          counts->set_exact_steps(counts->exact_steps() + 1);
        }
      }
      const bool last = step + 1 == steps_per_epoch_;
      if (!last && Seconds(last_progress) < sink_.progress_interval_s()) continue;
      // Reading the metrics waits for the devices: only at progress intervals.
      auto window = TakeTrainMetrics();
      if (!window.ok()) return window.status();
      epoch_metrics.loss_sum += window->loss_sum;
      epoch_metrics.top1 += window->top1;
      epoch_metrics.images += window->images;
      if (!std::isfinite(window->loss_sum)) {
        return absl::InternalError(absl::StrFormat(
            "training diverged: loss is %f in %s, epoch %d, step %d (lower the learning rate)",
            window->loss(), phase, epoch + 1, step + 1));
      }
      const double elapsed = train_seconds_ - phase_start_seconds + Seconds(epoch_start);
      const int64_t phase_step = static_cast<int64_t>(epoch) * steps_per_epoch_ + step;
      const int64_t done = (phase_step + 1) * batch_;
      const int64_t total = static_cast<int64_t>(epochs) * steps_per_epoch_ * batch_;
      Event e = sink_.New();
      auto* p = e.mutable_progress();
      p->set_phase(phase);
      p->set_epoch(epoch + 1);
      p->set_epochs(epochs);
      p->set_step(static_cast<int32_t>(global_step_ + step + 1));
      p->set_images_done((step + 1) * batch_);
      p->set_images_total(steps_per_epoch_ * batch_);
      p->set_loss(window->loss());
      p->set_top1(window->top1_rate());
      p->set_lr(clocks[0].lr(phase_step));
      p->set_images_per_s(done / std::max(elapsed, 1e-9));
      p->set_eta_s(elapsed / done * (total - done));
      sink_.Emit(e);
      last_progress = Clock::now();
    }
    const double epoch_seconds = Seconds(epoch_start);
    const int64_t epoch_images = static_cast<int64_t>(steps_per_epoch_ - first_step) * batch_;
    train_seconds_ += epoch_seconds;
    images_trained_ += epoch_images;
    auto joules_end = Joules();
    if (!joules_end.ok()) return joules_end.status();
    double train_jpi = 0;
    if (*joules_start >= 0 && *joules_end >= 0 && epoch_images > 0) {
      train_joules_ += *joules_end - *joules_start;
      energy_images_ += epoch_images;
      train_jpi = (*joules_end - *joules_start) / epoch_images;
    }
    global_step_ += steps_per_epoch_;
    ++epoch_;

    Event e = sink_.New();
    auto* es = e.mutable_epoch();
    es->set_phase(phase);
    es->set_epoch(epoch + 1);
    es->set_train_loss(epoch_metrics.loss());
    es->set_train_top1(epoch_metrics.top1_rate());
    es->set_lr(clocks[0].lr(static_cast<int64_t>(epoch + 1) * steps_per_epoch_ - 1));
    es->set_seconds(epoch_seconds);
    es->set_images_per_s((steps_per_epoch_ - first_step) * batch_ / epoch_seconds);
    es->set_sampled_steps(sampled_in_epoch);
    es->set_train_joules_per_image(train_jpi);
    const bool last_epoch = epoch + 1 == epochs;
    if (last_epoch || (epoch + 1) % spec_.train().eval_every_epochs() == 0) {
      auto r = EvaluateTest();
      if (!r.ok()) return r.status();
      es->set_evaluated(true);
      es->set_test_loss(r->loss);
      es->set_test_top1(r->top1);
      es->set_test_top5(r->top5);
      es->set_test_joules_per_image(r->joules_per_image);
    }
    sink_.Emit(e);
    const int every = spec_.checkpoints().every_epochs();
    if (every > 0 && epoch_ % every == 0 && !last_epoch) {
      phase_epoch_ = epoch + 1;  // the position a resume continues from
      TOPIARY_RETURN_IF_ERROR(Checkpoint(absl::StrFormat("epoch-%04d.h5", epoch_), true));
      phase_epoch_ = epoch;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> ExperimentRun::EvaluateTest() {
  auto joules_start = Joules();
  if (!joules_start.ok()) return joules_start.status();
  auto r = Evaluate(*eval_net_, *test_data_, data_->test.size());
  if (!r.ok()) return r.status();
  auto joules_end = Joules();
  if (!joules_end.ok()) return joules_end.status();
  if (*joules_start >= 0 && *joules_end >= 0 && r->images > 0) {
    r->joules_per_image = (*joules_end - *joules_start) / r->images;
  }
  summary_->set_test_joules_per_image(r->joules_per_image);
  metrics_.set_test_joules_per_image(r->joules_per_image);
  summary_->clear_conv_input_sparsity();
  metrics_.clear_conv_input_sparsity();
  for (const auto& [layer, zeros] : r->conv_input_zeros) {
    for (auto* list :
         {summary_->mutable_conv_input_sparsity(), metrics_.mutable_conv_input_sparsity()}) {
      auto* l = list->Add();
      l->set_layer(layer);
      l->set_zero_fraction(zeros);
    }
  }
  summary_->set_test_loss(r->loss);
  summary_->set_test_top1(r->top1);
  summary_->set_test_top5(r->top5);
  metrics_.set_test_loss(r->loss);
  metrics_.set_test_top1(r->top1);
  last_eval_ = *r;
  return r;
}

absl::StatusOr<GradientStats> ExperimentRun::GradientStatistics() {
  constexpr int kBatches = 8;
  std::vector<Parameter*> kernels, running;
  for (Parameter* p : model()->parameters()) {
    if (p->role == ParamRole::kKernel) kernels.push_back(p);
    if (!p->trainable) running.push_back(p);
  }
  std::vector<std::vector<float>> saved;
  for (Parameter* p : running) saved.push_back(p->value.ToHost());
  GradientStats stats;
  for (Parameter* p : kernels) stats[p->full_name()].assign(p->size(), 0.0f);
  const std::vector<int32_t> order = train_batcher_->EpochOrder(epoch_);
  for (Rank& rank : ranks_) TOPIARY_RETURN_IF_ERROR(rank.train_data->SetOrder(order));
  for (int b = 0; b < kBatches && (b + 1) * batch_ <= static_cast<int>(data_->train.size()); ++b) {
    // Each rank its share of the batch: rank 0's gradients are then the whole batch's.
    TOPIARY_RETURN_IF_ERROR(OnRanks([&](int r) -> absl::Status {
      Network& net = *ranks_[r].train_net;
      TOPIARY_RETURN_IF_ERROR(ranks_[r].train_data->Assemble(
          nullptr, epoch_,
          static_cast<int64_t>(b) * batch_ + static_cast<int64_t>(r) * local_batch_, local_batch_,
          false, net.input(), net.labels()));
      TOPIARY_RETURN_IF_ERROR(net.Forward(true));
      TOPIARY_RETURN_IF_ERROR(net.Loss(0.0f));
      return net.Backward();
    }));
    for (Parameter* p : kernels) {
      const std::vector<float> g = p->grad.ToHost();
      std::vector<float>& acc = stats[p->full_name()];
      for (size_t i = 0; i < g.size(); ++i) acc[i] += std::fabs(g[i]) / kBatches;
    }
  }
  TOPIARY_RETURN_IF_ERROR(TakeTrainMetrics().status());
  for (size_t i = 0; i < running.size(); ++i) running[i]->value.CopyFromHost(saved[i].data());
  return stats;
}

namespace {

topiary::v1::MaskKind MaskKindOf(MaskInfo::Kind kind) {
  switch (kind) {
    case MaskInfo::Kind::kBlock:
      return topiary::v1::MASK_BLOCK;
    case MaskInfo::Kind::kElement:
      return topiary::v1::MASK_ELEMENT;
    case MaskInfo::Kind::kNofM:
      return topiary::v1::MASK_N_OF_M;
    case MaskInfo::Kind::kNone:
      break;
  }
  return topiary::v1::MASK_NONE;
}

// A layer's measured block-sparse dispatch (trainer/nn/sparse_dispatch.h) in a round's report.
void SetEngineChoice(const SparseConvChoice& c, LayerSparsity* l) {
  topiary::v1::ConvPassChoice* passes[3] = {l->mutable_forward(), l->mutable_backward_data(),
                                            l->mutable_backward_filter()};
  for (int i = 0; i < 3; ++i) {
    passes[i]->set_chosen(c.sparse[i] ? topiary::v1::ConvPassChoice::BLOCK_SPARSE
                                      : topiary::v1::ConvPassChoice::DENSE);
    passes[i]->set_dense_ms(c.dense_ms[i]);
    passes[i]->set_sparse_ms(c.sparse_ms[i]);
    passes[i]->set_config(c.config[i]);
  }
}

}  // namespace

RoundSummary ExperimentRun::SparsityRow(int round,
                                        const std::vector<LayerPruneReport>* reports) const {
  RoundSummary row;
  row.set_round(round);
  const auto choices = ranks_[0].train_net->SparseConvChoices();
  int64_t total = 0, zeros = 0;
  for (const Model::Node& node : model()->nodes()) {
    for (Parameter* p : node.layer->parameters()) {
      if (p->role != ParamRole::kKernel) continue;
      const int64_t masked = MaskedCount(*p);
      total += static_cast<int64_t>(p->size());
      zeros += masked;
      if (p->mask_info.kind == MaskInfo::Kind::kNone) continue;
      LayerSparsity* l = row.add_layers();
      l->set_layer(p->layer);
      l->set_mask(MaskKindOf(p->mask_info.kind));
      l->set_sparsity(static_cast<double>(masked) / p->size());
      if (p->mask_info.kind == MaskInfo::Kind::kBlock) {
        l->set_units(static_cast<int64_t>(p->mask_info.grid.size()));
        l->set_zero_units(std::count(p->mask_info.grid.begin(), p->mask_info.grid.end(), 0));
        for (const auto& [layer, choice] : choices) {
          if (layer == p->layer) SetEngineChoice(choice, l);
        }
      } else {
        l->set_units(static_cast<int64_t>(p->size()));
        l->set_zero_units(masked);
      }
    }
  }
  if (reports != nullptr) {
    for (const LayerPruneReport& r : *reports) {
      for (LayerSparsity& l : *row.mutable_layers()) {
        if (l.layer() != r.layer) continue;
        l.set_target_units(r.target_zeros);
        if (r.requested_zeros > r.target_zeros) l.set_requested_units(r.requested_zeros);
        l.set_fallback(r.fallback);
        l.set_zero_units_before(r.zeros_before);
      }
      row.set_layers_pruned(row.layers_pruned() + 1);
      row.set_layers_at_target(row.layers_at_target() + (r.reached ? 1 : 0));
      row.set_layers_stalled(row.layers_stalled() + (r.stalled && !r.reached ? 1 : 0));
    }
  }
  row.set_sparsity(total > 0 ? static_cast<double>(zeros) / total : 0);
  return row;
}

absl::Status ExperimentRun::NoteTarget() {
  auto pruner = options_.make_pruner(spec_.pruning(), model(), spec_.seed());
  if (!pruner.ok()) return pruner.status();
  summary_->set_target_reached((*pruner)->finished());
  if (summary_->target_reached()) return absl::OkStatus();
  std::vector<std::string> short_layers;
  const RoundSummary now = SparsityRow(round_, nullptr);
  const RoundSummary& last = metrics_.rounds(metrics_.rounds_size() - 1);
  for (const LayerSparsity& l : last.layers()) {
    if (l.target_units() > 0 && l.zero_units() < l.target_units()) {
      short_layers.push_back(absl::StrFormat("%s %.1f%%", l.layer(), 100 * l.sparsity()));
    }
  }
  const size_t shown = std::min<size_t>(short_layers.size(), 4);
  summary_->set_target_note(absl::StrFormat(
      "target %.1f%% not reached: %s; sparsity %.1f%% after %d round(s)%s%s",
      100 * spec_.pruning().target(),
      stalled_round_ > 0 ? "no layer below its target could gain a zero"
                         : absl::StrFormat("max_rounds (%d) ended the rounds",
                                           spec_.pruning().max_rounds()),
      100 * now.sparsity(), round_,
      short_layers.empty() ? "" : "; short of their target: ",
      absl::StrJoin(short_layers.begin(), short_layers.begin() + shown, ", ") +
          (short_layers.size() > shown
               ? absl::StrFormat(" and %d more", short_layers.size() - shown)
               : "")));
  return absl::OkStatus();
}

absl::Status ExperimentRun::Checkpoint(const std::string& name, bool periodic) {
  if (options_.out_dir.empty()) return absl::OkStatus();
  const std::string dir = options_.out_dir + "/checkpoints";
  TOPIARY_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string path = dir + "/" + name;
  CheckpointState state;
  state.experiment_id = options_.experiment_id.empty() ? spec_.name() : options_.experiment_id;
  state.parent = parent_;
  state.spec_text = SpecToText(spec_);
  state.round = round_;
  state.epoch = epoch_;
  state.phase_epoch = phase_epoch_;
  state.epoch_step = epoch_step_;
  state.global_step = global_step_ + epoch_step_;
  state.seed = spec_.seed();
  metrics_.set_sparsity(SparsityRow(round_, nullptr).sparsity());
  metrics_.set_train_joules_per_image(TrainJoulesPerImage());
  state.metrics_json = MessageToJson(metrics_);
  state.input_json = input_json_;
  // Rank 0 writes; every other rank must hold the same model, bit for bit.
  for (size_t r = 1; r < ranks_.size(); ++r) {
    auto diff = FirstDifference(*model(), *ranks_[r].model);
    if (!diff.ok()) return diff.status();
    if (!diff->empty()) {
      return absl::InternalError(absl::StrFormat(
          "data parallelism: rank %d (%s) differs from rank 0 at %s; not writing %s", r,
          ranks_[r].device->name(), *diff, name));
    }
  }
  TOPIARY_RETURN_IF_ERROR(SaveCheckpoint(path, *model(), state));
  summary_->set_checkpoint(path);
  Event e = sink_.New();
  auto* c = e.mutable_checkpoint();
  c->set_path(path);
  c->set_round(round_);
  c->set_epoch(epoch_);
  if (ranks_.size() > 1) c->set_ranks_identical(static_cast<int32_t>(ranks_.size()));
  sink_.Emit(e);
  if (periodic) {
    // The periodic checkpoints of earlier starts of this run (before a pause, a restart)
    // count towards keep_last too.
    if (periodic_.empty()) periodic_ = EarlierPeriodicCheckpoints(dir, epoch_);
    periodic_.push_back(path);
    const int keep = spec_.checkpoints().keep_last();
    while (keep > 0 && static_cast<int>(periodic_.size()) > keep) {
      std::remove(periodic_.front().c_str());
      periodic_.erase(periodic_.begin());
    }
  }
  return absl::OkStatus();
}

absl::Status ExperimentRun::CheckStop(int step_in_epoch) {
  if (options_.control == nullptr) return absl::OkStatus();
  const RunControl::Stop stop = options_.control->ShouldStop();
  if (stop == RunControl::Stop::kNone) return absl::OkStatus();
  stopped_ = stop;
  if (stop == RunControl::Stop::kPause) {
    epoch_step_ = step_in_epoch;
    TOPIARY_RETURN_IF_ERROR(Checkpoint("pause.h5", false));
  }
  return absl::AbortedError(stop == RunControl::Stop::kPause ? "paused" : "cancelled");
}

absl::Status ExperimentRun::Round(bool prune, Pruner* pruner) {
  const auto& pr = spec_.pruning();
  topiary::v1::LrSchedule cosine;
  cosine.set_kind(topiary::v1::LrSchedule::COSINE);
  const std::vector<float> finetune_lr = LrTable(cosine, pr.finetune_lr(), pr.finetune_epochs());
  const Clock::time_point start = Clock::now();
  std::vector<LayerPruneReport> reports;
  if (prune) {
    ++round_;
    GradientStats grads;
    if (pruner->needs_gradients()) {
      auto g = GradientStatistics();
      if (!g.ok()) return g.status();
      grads = std::move(*g);
    }
    auto step = pruner->Step(round_, pruner->needs_gradients() ? &grads : nullptr);
    if (!step.ok()) return step.status();
    reports = std::move(*step);
    TOPIARY_RETURN_IF_ERROR(Replicate());  // rank 0 pruned: the same masks on every rank
    phase_epoch_ = 0;
  }
  TOPIARY_RETURN_IF_ERROR(
      TrainPhase(absl::StrCat("round ", round_), spec_.pruning().finetune_epochs(), finetune_lr));
  auto r = last_eval_ ? absl::StatusOr<EvalResult>(*last_eval_) : EvaluateTest();
  if (!r.ok()) return r.status();
  RoundSummary* row = metrics_.add_rounds();
  *row = SparsityRow(round_, prune ? &reports : nullptr);
  row->set_test_top1(r->top1);
  row->set_test_loss(r->loss);
  row->set_seconds(Seconds(start));
  TOPIARY_RETURN_IF_ERROR(Checkpoint(absl::StrFormat("round-%03d.h5", round_), false));
  row = metrics_.mutable_rounds(metrics_.rounds_size() - 1);
  row->set_checkpoint(summary_->checkpoint());
  Event e = sink_.New();
  *e.mutable_round() = *row;
  sink_.Emit(e);
  return absl::OkStatus();
}

absl::Status ExperimentRun::Execute() {
  const Clock::time_point start = Clock::now();
  if (!dense_done_) {
    const auto& t = spec_.train();
    TOPIARY_RETURN_IF_ERROR(
        TrainPhase("dense", t.epochs(), LrTable(t.lr_schedule(), t.optimizer().lr(), t.epochs())));
  }
  if (round_ == 0 && metrics_.rounds_size() == 0) {
    // The dense model (trained here, or loaded by init_from_checkpoint): round 0.
    auto r = last_eval_ ? absl::StatusOr<EvalResult>(*last_eval_) : EvaluateTest();
    if (!r.ok()) return r.status();
    metrics_.set_dense_top1(r->top1);
    RoundSummary row = SparsityRow(0, nullptr);
    row.set_test_top1(r->top1);
    row.set_test_loss(r->loss);
    row.set_seconds(Seconds(start));
    Event e = sink_.New();
    *e.mutable_round() = row;
    phase_epoch_ = spec_.train().epochs();
    *metrics_.add_rounds() = row;
    if (TrainsDensePhase()) {
      TOPIARY_RETURN_IF_ERROR(Checkpoint("dense.h5", false));
      metrics_.mutable_rounds(0)->set_checkpoint(summary_->checkpoint());
    }
    *e.mutable_round() = metrics_.rounds(0);
    if (spec_.has_pruning()) sink_.Emit(e);
  }
  if (spec_.has_pruning()) {
    // A resumed run may have stopped inside a round's fine-tuning: finish that round first.
    if (round_ > 0 && metrics_.rounds_size() <= round_) {
      TOPIARY_RETURN_IF_ERROR(Round(/*prune=*/false));
    }
    while (true) {
      // The pruner keeps no state of its own: made anew, it follows spec changes.
      auto pruner = options_.make_pruner(spec_.pruning(), model(), spec_.seed());
      if (!pruner.ok()) return pruner.status();
      if (round_ >= spec_.pruning().max_rounds() || (*pruner)->finished()) break;
      if (spec_.pruning().manual_rounds() && options_.control != nullptr) {
        const RunControl::Stop stop =
            options_.control->WaitForRound(round_, spec_.mutable_pruning());
        if (stop != RunControl::Stop::kNone) {
          stopped_ = stop;  // the last round's checkpoint is where a resume continues
          return absl::AbortedError("stopped while waiting for a round");
        }
        pruner = options_.make_pruner(spec_.pruning(), model(), spec_.seed());
        if (!pruner.ok()) return pruner.status();
      }
      TOPIARY_RETURN_IF_ERROR(Round(/*prune=*/true, pruner->get()));
      // Every layer at its target or unable to add a zero: more rounds would only repeat
      // this one (the pruner is made anew each round, so the runner remembers this).
      const RoundSummary& last = metrics_.rounds(metrics_.rounds_size() - 1);
      if (last.layers_stalled() > 0 &&
          last.layers_at_target() + last.layers_stalled() >= last.layers_pruned()) {
        stalled_round_ = round_;
        break;
      }
    }
    TOPIARY_RETURN_IF_ERROR(NoteTarget());
  }
  summary_->set_epochs(epoch_);
  summary_->set_dense_top1(metrics_.dense_top1());
  summary_->set_sparsity(SparsityRow(round_, nullptr).sparsity());
  *summary_->mutable_rounds() = metrics_.rounds();
  if (metrics_.has_gradient_sampling()) {
    *summary_->mutable_gradient_sampling() = metrics_.gradient_sampling();
  }
  summary_->set_train_images_per_s(train_seconds_ > 0 ? images_trained_ / train_seconds_ : 0);
  summary_->set_train_joules_per_image(TrainJoulesPerImage());
  return absl::OkStatus();
}

absl::StatusOr<double> ExperimentRun::Joules() {
  if (energy_.empty()) return -1.0;
  double sum = 0;
  for (size_t r = 0; r < energy_.size(); ++r) {
    TOPIARY_RETURN_IF_ERROR(ranks_[r].device->Synchronize());  // the work so far, and no more
    auto j = energy_[r]->Joules();
    if (!j.ok()) return -1.0;  // a counter that stops answering only loses figures
    sum += *j;
  }
  return sum;
}

absl::Status ExperimentRun::Replicate() {
  for (size_t r = 1; r < ranks_.size(); ++r) {
    TOPIARY_RETURN_IF_ERROR(CopyModelState(*model(), ranks_[r].model.get()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Metrics> ExperimentRun::TakeTrainMetrics() {
  Metrics sum;
  for (Rank& rank : ranks_) {
    auto m = rank.train_net->TakeMetrics();
    if (!m.ok()) return m.status();
    sum.loss_sum += m->loss_sum;
    sum.top1 += m->top1;
    sum.top5 += m->top5;
    sum.images += m->images;
  }
  return sum;
}

PlanOptions ExperimentRun::PlanOptionsForSpec() const {
  PlanOptions options;
  options.precision = PrecisionOf(spec_.train().precision());
  options.deterministic = spec_.device().deterministic();
  return options;
}

}  // namespace

kernels::Precision PrecisionOf(topiary::v1::TrainSpec::Precision p) {
  switch (p) {
    case topiary::v1::TrainSpec::TF32:
      return kernels::Precision::kTf32;
    case topiary::v1::TrainSpec::BF16:
      return kernels::Precision::kBf16;
    default:
      return kernels::Precision::kFp32;
  }
}

absl::StatusOr<EvalResult> Evaluate(Network& net, const DeviceBatches& data, int64_t images) {
  const int batch = net.batch();
  TOPIARY_RETURN_IF_ERROR(net.TakeMetrics().status());  // start from zero
  for (int64_t first = 0; first < images; first += batch) {
    const int count = static_cast<int>(std::min<int64_t>(batch, images - first));
    // Rows past `count` keep the previous batch's images: inference treats each image on
    // its own, so they cannot affect the real ones, and they are not counted.
    TOPIARY_RETURN_IF_ERROR(
        data.Assemble(nullptr, 0, first, count, false, net.input(), net.labels()));
    TOPIARY_RETURN_IF_ERROR(net.Forward(false, /*count_input_zeros=*/count));
    TOPIARY_RETURN_IF_ERROR(net.Loss(0.0f, count));
  }
  auto m = net.TakeMetrics();
  if (!m.ok()) return m.status();
  auto zeros = net.TakeConvInputZeros();
  if (!zeros.ok()) return zeros.status();
  EvalResult r;
  r.conv_input_zeros = std::move(*zeros);
  r.images = static_cast<int64_t>(m->images);
  r.loss = m->loss();
  r.top1 = m->top1_rate();
  r.top5 = m->top5_rate();
  return r;
}

RunSummary RunExperiment(const ExperimentSpec& raw_spec, const RunOptions& options) {
  const Clock::time_point start = Clock::now();
  RunSummary summary;
  summary.set_out_dir(options.out_dir);
  absl::Status status = ValidateSpec(raw_spec);
  const ExperimentSpec spec = WithDefaults(raw_spec);
  if (status.ok() && !options.out_dir.empty()) {
    status = MakeDirs(options.out_dir);
    if (!status.ok())
      status = absl::PermissionDeniedError(absl::StrCat("--out: ", status.message()));
    if (status.ok())
      status = WriteFileAtomic(options.out_dir + "/spec.textproto", SpecToText(spec));
  }
  EventSink sink(options, start);
  if (status.ok()) {
    ExperimentRun run(spec, options, sink, &summary);
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
      summary.set_state(run.stopped() == RunControl::Stop::kPause ? topiary::v1::PAUSED
                                                                   : topiary::v1::CANCELLED);
      status = absl::OkStatus();
    }
  }
  if (summary.state() == topiary::v1::STATE_UNSPECIFIED) {
    summary.set_state(status.ok() ? topiary::v1::SUCCEEDED : topiary::v1::FAILED);
  }
  if (!status.ok()) summary.set_error(std::string(status.message()));
  summary.set_seconds(Seconds(start));
  Event e = sink.New();
  *e.mutable_summary() = summary;
  sink.Emit(e);
  if (!options.out_dir.empty() && IsDirectory(options.out_dir)) {
    (void)WriteFileAtomic(options.out_dir + "/summary.json", MessageToJson(summary) + "\n");
  }
  return summary;
}

}  // namespace topiary
