#include "trainer/run/phase_trainer.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/dist/batch_norm_sync.h"
#include "trainer/nn/plan_cache.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/run/events.h"
#include "trainer/run/step_runner.h"
#include "util/status_macros.h"

namespace topiary {

using topiary::v1::Event;

absl::StatusOr<std::unique_ptr<Network>> PlanWithEvents(Model* model, int batch, bool training,
                                                        const PlanOptions& plan_options, int ranks,
                                                        RunRecorder* recorder) {
  std::string name = absl::StrFormat("%s, batch %d", training ? "training" : "evaluation", batch);
  if (training && ranks > 1) absl::StrAppend(&name, " per rank, ", ranks, " ranks");
  RunClock::time_point last = RunClock::now();
  auto fill = [&](const PlanProgress& p, topiary::v1::Planning* out) {
    out->set_network(name);
    out->set_layers_done(p.layers_done);
    out->set_layers_total(p.layers_total);
    out->set_convolutions_cached(p.convs_cached);
    out->set_convolutions_measured(p.convs_measured);
    out->set_convolutions_untimed(p.convs_untimed);
    out->set_seconds(p.seconds);
  };
  PlanOptions options = plan_options;
  options.progress = [&](const PlanProgress& p) {
    if (SecondsSince(last) < recorder->progress_interval_s()) return;
    last = RunClock::now();
    Event e = recorder->New();
    fill(p, e.mutable_planning());
    recorder->Emit(e);
  };
  TOPIARY_ASSIGN_OR_RETURN(std::unique_ptr<Network> net,
                           Network::Plan(model, batch, training, options));
  Event e = recorder->New();
  auto* done = e.mutable_planning();
  fill(net->plan_progress(), done);
  done->set_done(true);
  done->set_planned_bytes(static_cast<int64_t>(net->planned_bytes()));
  for (const std::string& line : net->PlanReport()) done->add_layers(line);
  if (training && model->device()->cuda() != nullptr) {
    const ConvPlanCache& cache = ConvPlanCache::Global();
    for (const std::string& f : cache.files()) done->add_cache_files(f);
    for (const std::string& n : cache.notes()) done->add_cache_notes(n);
  }
  recorder->Emit(e);
  return net;
}

PhaseTrainer::PhaseTrainer(const topiary::v1::ExperimentSpec& spec, RankGroup* ranks,
                           Batcher* batcher, RunRecorder* recorder)
    : spec_(spec), group_(ranks), batcher_(batcher), recorder_(recorder), ranks_(ranks->size()) {}

absl::StatusOr<std::unique_ptr<PhaseTrainer>> PhaseTrainer::Create(
    const topiary::v1::ExperimentSpec& spec, RankGroup* ranks, Batcher* batcher,
    RunRecorder* recorder) {
  std::unique_ptr<PhaseTrainer> t(new PhaseTrainer(spec, ranks, batcher, recorder));
  t->batch_ = spec.data().batch_size();
  t->local_batch_ = t->batch_ / ranks->world_size();  // ValidateSpec: it divides
  t->steps_per_epoch_ = static_cast<int>(batcher->set().size() / t->batch_);
  if (spec.has_gradient_sampling()) t->sampling_.emplace(spec.gradient_sampling(), spec.seed());
  TOPIARY_RETURN_IF_ERROR(ranks->Run([&](int r) -> absl::Status {
    RankState& rank = t->ranks_[r];
    TOPIARY_ASSIGN_OR_RETURN(DeviceBatches data, DeviceBatches::Create(batcher, ranks->device(r)));
    rank.data.emplace(std::move(data));
    return absl::OkStatus();
  }));
  return t;
}

void PhaseTrainer::Release() {
  for (RankState& rank : ranks_) {
    rank.net.reset();
    rank.sync.reset();
    rank.batch_norm_sync.reset();
    rank.optimizer.reset();
  }
}

absl::Status PhaseTrainer::Plan() {
  RankGroup& group = *group_;
  PlanOptions options = PlanOptionsForSpec(spec_);
  if (spec_.device().sync_batch_norm()) options.batch_norm_ranks = group.size();
  for (int r = 0; r < group.size(); ++r) {
    ranks_[r].optimizer.emplace(group.model(r)->parameters(), spec_.train().optimizer(),
                                group.device(r));
  }
  TOPIARY_ASSIGN_OR_RETURN(ranks_[0].net, PlanWithEvents(group.model(0), local_batch_, true,
                                                         options, group.size(), recorder_));
  return group.Run([&](int r) -> absl::Status {
    RankState& rank = ranks_[r];
    if (r > 0) {
      TOPIARY_ASSIGN_OR_RETURN(rank.net,
                               Network::Plan(group.model(r), local_batch_, true, options));
    }
    if (group.collective() == nullptr) return absl::OkStatus();
    TOPIARY_ASSIGN_OR_RETURN(rank.sync,
                             GradientSync::Create(group.model(r), group.collective(), r,
                                                  rank.net->dtype() == kernels::DType::kBf16));
    rank.net->set_gradient_reducer(rank.sync.get());
    if (spec_.device().sync_batch_norm()) {
      rank.batch_norm_sync =
          MakeBatchNormSync(group.collective(), r, WidestBatchNorm(*group.model(r)));
      rank.net->set_batch_norm_sync(rank.batch_norm_sync.get());
    }
    return absl::OkStatus();
  });
}

std::vector<float> PhaseTrainer::LrTable(const topiary::v1::LrSchedule& schedule, double base_lr,
                                         int epochs) const {
  // Evaluated at the end of each step so that a warm-up never uses a rate of exactly zero.
  std::vector<float> table(static_cast<size_t>(epochs) * steps_per_epoch_);
  for (size_t t = 0; t < table.size(); ++t) {
    table[t] =
        static_cast<float>(LearningRate(schedule, base_lr, (t + 1.0) / steps_per_epoch_, epochs));
  }
  return table;
}

struct PhaseTrainer::Phase {
  topiary::v1::Phase which;
  int epochs = 0;
  std::vector<TrainingClock> clocks;       // per rank
  std::vector<StepRunner> exact, sampled;  // per rank
  std::function<absl::Status(int)> run_exact, run_sampled;
  double start_seconds = 0;  // the trainer's seconds when the phase began
  // The epoch under way.
  int epoch = 0;       // of the phase
  int first_step = 0;  // non-zero once, when resuming a paused run
  RunClock::time_point epoch_start, last_progress;
  Metrics metrics;
  int sampled_steps = 0;
  double joules_start = -1;
};

absl::Status PhaseTrainer::Train(const topiary::v1::Phase& which, int epochs,
                                 const std::vector<float>& lr_table, PhaseHooks& hooks) {
  Phase phase;
  phase.which = which;
  phase.epochs = epochs;
  phase.start_seconds = seconds_;
  for (int r = 0; r < group_->size(); ++r) {
    TOPIARY_ASSIGN_OR_RETURN(TrainingClock clock,
                             TrainingClock::Create(group_->device(r), lr_table));
    phase.clocks.push_back(std::move(clock));
  }
  const float smoothing = spec_.train().label_smoothing();
  const bool augment = batcher_->augments();
  // One training step of rank r, enqueued; everything that varies per step is read from the
  // clock. Rank r takes its share of the global batch, at offset r * local_batch_.
  auto step = [this, &phase, smoothing, augment](int r, bool sample) -> absl::Status {
    RankState& rank = ranks_[r];
    Network& net = *rank.net;
    TrainingClock& clock = phase.clocks[r];
    SetSampling(group_->model(r), sample);
    TOPIARY_RETURN_IF_ERROR(clock.Tick(batch_));
    TOPIARY_RETURN_IF_ERROR(rank.data->Assemble(
        clock.clock(), 0, static_cast<int64_t>(group_->global_rank(r)) * local_batch_, local_batch_,
        augment, net.input(), net.labels()));
    TOPIARY_RETURN_IF_ERROR(net.Forward(true));
    TOPIARY_RETURN_IF_ERROR(net.Loss(smoothing));
    TOPIARY_RETURN_IF_ERROR(net.Backward());  // averages the ranks' gradients
    return rank.optimizer->Step(clock.clock());
  };
  // On a GPU the step is captured as a CUDA graph after one eager step and replayed. Each
  // phase captures anew: a prune step may have added mask buffers. A step that samples weight
  // gradients enqueues other kernels than an exact one: each kind has its own graph.
  const bool graphs = spec_.device().cuda_graphs() != topiary::v1::DeviceSpec::GRAPHS_OFF;
  for (int r = 0; r < group_->size(); ++r) {
    Device* d = group_->device(r);
    phase.exact.emplace_back(
        d, [step, r] { return step(r, false); }, graphs, /*eager_steps=*/1);
    phase.sampled.emplace_back(
        d, [step, r] { return step(r, true); }, graphs, 1);
  }
  // Made once: a std::function built per step would allocate on the host every step.
  phase.run_exact = [&phase](int r) { return phase.exact[r].Run(); };
  phase.run_sampled = [&phase](int r) { return phase.sampled[r].Run(); };
  const double seconds_before = seconds_;
  const int64_t images_before = images_;
  while (position_.phase_epoch < epochs) {  // EndEpoch moves it on
    phase.epoch = position_.phase_epoch;
    TOPIARY_RETURN_IF_ERROR(Epoch(phase, hooks));
  }
  const int64_t steps = (images_ - images_before) / batch_;
  phase_step_seconds_ = steps > 0 ? (seconds_ - seconds_before) / steps : 0;
  return absl::OkStatus();
}

absl::Status PhaseTrainer::Epoch(Phase& phase, PhaseHooks& hooks) {
  RunPosition& at = position_;
  phase.epoch_start = phase.last_progress = RunClock::now();
  phase.first_step = at.epoch_step;
  phase.metrics = Metrics{};
  phase.sampled_steps = 0;
  const std::vector<int32_t> order = batcher_->EpochOrder(at.epoch);
  for (int r = 0; r < group_->size(); ++r) {
    TOPIARY_RETURN_IF_ERROR(ranks_[r].data->SetOrder(order));
    TOPIARY_RETURN_IF_ERROR(phase.clocks[r].BeginEpoch(
        at.epoch, static_cast<int64_t>(phase.epoch) * steps_per_epoch_, phase.first_step));
  }
  TOPIARY_ASSIGN_OR_RETURN(phase.joules_start, recorder_->energy()->Joules());
  for (int step = phase.first_step; step < steps_per_epoch_; ++step) {
    at.epoch_step = step;  // what a pause checkpoint before this step saves
    TOPIARY_RETURN_IF_ERROR(hooks.BeforeStep(step));
    const bool sample = sampling_ && sampling_->Samples(at.epoch, step, at.epoch_start_step + step);
    for (int r = 0; r < group_->size(); ++r) {  // streamed sets: the step's batch, staged
      TOPIARY_RETURN_IF_ERROR(
          ranks_[r].data->Stage(at.epoch,
                                static_cast<int64_t>(step) * batch_ +
                                    static_cast<int64_t>(group_->global_rank(r)) * local_batch_,
                                local_batch_, batcher_->augments(), batch_));
    }
    TOPIARY_RETURN_IF_ERROR(group_->Run(sample ? phase.run_sampled : phase.run_exact));
    if (sampling_) {
      auto* counts = recorder_->metrics().mutable_gradient_sampling();
      if (sample) {
        counts->set_sampled_steps(counts->sampled_steps() + 1);
        ++phase.sampled_steps;
      } else {
        counts->set_exact_steps(counts->exact_steps() + 1);
      }
    }
    TOPIARY_RETURN_IF_ERROR(ReportProgress(phase, step, step + 1 == steps_per_epoch_));
  }
  return EndEpoch(phase, hooks);
}

absl::Status PhaseTrainer::ReportProgress(Phase& phase, int step, bool last) {
  if (!last && !group_->world().multi() &&
      SecondsSince(phase.last_progress) < recorder_->progress_interval_s()) {
    return absl::OkStatus();
  }
  // The processes of a world take their metrics together (an exchange), so at the same
  // steps: every kWorldProgressSteps, not by each one's clock.
  constexpr int kWorldProgressSteps = 16;
  if (!last && group_->world().multi() && (step + 1) % kWorldProgressSteps != 0) {
    return absl::OkStatus();
  }
  TOPIARY_ASSIGN_OR_RETURN(const Metrics window, TakeMetrics());
  phase.metrics.loss_sum += window.loss_sum;
  phase.metrics.top1 += window.top1;
  phase.metrics.images += window.images;
  if (!std::isfinite(window.loss_sum)) {
    return absl::InternalError(absl::StrFormat(
        "training diverged: loss is %f in %s, epoch %d, step %d (lower the learning rate)",
        window.loss(), PhaseName(phase.which), phase.epoch + 1, step + 1));
  }
  const double elapsed = seconds_ - phase.start_seconds + SecondsSince(phase.epoch_start);
  const int64_t phase_step = static_cast<int64_t>(phase.epoch) * steps_per_epoch_ + step;
  const int64_t done = (phase_step + 1) * batch_;
  const int64_t total = static_cast<int64_t>(phase.epochs) * steps_per_epoch_ * batch_;
  Event e = recorder_->New();
  auto* p = e.mutable_progress();
  *p->mutable_training_phase() = phase.which;
  p->set_epoch(phase.epoch + 1);
  p->set_epochs(phase.epochs);
  p->set_step(static_cast<int32_t>(position_.epoch_start_step + step + 1));
  p->set_images_done((step + 1) * batch_);
  p->set_images_total(steps_per_epoch_ * batch_);
  p->set_loss(window.loss());
  p->set_top1(window.top1_rate());
  p->set_lr(phase.clocks[0].lr(phase_step));
  p->set_images_per_s(done / std::max(elapsed, 1e-9));
  p->set_eta_s(elapsed / done * (total - done));
  recorder_->Emit(e);
  phase.last_progress = RunClock::now();
  return absl::OkStatus();
}

absl::Status PhaseTrainer::EndEpoch(Phase& phase, PhaseHooks& hooks) {
  RunPosition& at = position_;
  const double epoch_seconds = SecondsSince(phase.epoch_start);
  const int steps = steps_per_epoch_ - phase.first_step;
  const int64_t epoch_images = static_cast<int64_t>(steps) * batch_;
  seconds_ += epoch_seconds;
  images_ += epoch_images;
  TOPIARY_ASSIGN_OR_RETURN(const double joules_end, recorder_->energy()->Joules());
  const double train_jpi =
      recorder_->energy()->AddTraining(phase.joules_start, joules_end, epoch_images);
  at.epoch_start_step += steps_per_epoch_;
  at.epoch_step = 0;
  ++at.epoch;
  ++at.phase_epoch;  // what a resume continues from

  Event e = recorder_->New();
  auto* es = e.mutable_epoch();
  *es->mutable_training_phase() = phase.which;
  es->set_epoch(phase.epoch + 1);
  es->set_train_loss(phase.metrics.loss());
  es->set_train_top1(phase.metrics.top1_rate());
  es->set_lr(phase.clocks[0].lr(static_cast<int64_t>(phase.epoch + 1) * steps_per_epoch_ - 1));
  es->set_seconds(epoch_seconds);
  es->set_images_per_s(epoch_images / epoch_seconds);
  es->set_sampled_steps(phase.sampled_steps);
  es->set_train_joules_per_image(train_jpi);
  const bool last_epoch = phase.epoch + 1 == phase.epochs;
  if (last_epoch || (phase.epoch + 1) % spec_.train().eval_every_epochs() == 0) {
    TOPIARY_ASSIGN_OR_RETURN(const EvalResult r, hooks.EvaluateHeldOut());
    es->set_evaluated(true);
    SetEvalFigures(r, es);
    if (!r.validation) es->set_test_top5(r.top5);
    es->set_test_joules_per_image(r.joules_per_image);
  }
  recorder_->Emit(e);
  const int every = spec_.checkpoints().every_epochs();
  if (every > 0 && at.epoch % every == 0 && !last_epoch) {
    TOPIARY_RETURN_IF_ERROR(hooks.PeriodicCheckpoint());
  }
  return absl::OkStatus();
}

absl::StatusOr<GradientStats> PhaseTrainer::GradientStatistics() {
  constexpr int kBatches = 8;
  std::vector<Parameter*> kernels, running;
  for (Parameter* p : group_->model(0)->parameters()) {
    if (p->role == ParamRole::kKernel) kernels.push_back(p);
    if (!p->trainable) running.push_back(p);
  }
  std::vector<std::vector<float>> saved;
  for (Parameter* p : running) saved.push_back(p->value.ToHost());
  GradientStats stats;
  for (Parameter* p : kernels) stats[p->full_name()].assign(p->size(), 0.0f);
  const int epoch = position_.epoch;
  const std::vector<int32_t> order = batcher_->EpochOrder(epoch);
  for (RankState& rank : ranks_) TOPIARY_RETURN_IF_ERROR(rank.data->SetOrder(order));
  for (int b = 0; b < kBatches && (b + 1) * batch_ <= static_cast<int>(batcher_->set().size());
       ++b) {
    // Each rank its share of the batch: rank 0's gradients are then the whole batch's.
    TOPIARY_RETURN_IF_ERROR(group_->Run([&](int r) -> absl::Status {
      Network& net = *ranks_[r].net;
      TOPIARY_RETURN_IF_ERROR(
          ranks_[r].data->Assemble(nullptr, epoch,
                                   static_cast<int64_t>(b) * batch_ +
                                       static_cast<int64_t>(group_->global_rank(r)) * local_batch_,
                                   local_batch_, false, net.input(), net.labels()));
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
  TOPIARY_RETURN_IF_ERROR(TakeMetrics().status());
  for (size_t i = 0; i < running.size(); ++i) running[i]->value.CopyFromHost(saved[i].data());
  return stats;
}

absl::StatusOr<Metrics> PhaseTrainer::TakeMetrics() {
  Metrics sum;
  for (RankState& rank : ranks_) {
    TOPIARY_ASSIGN_OR_RETURN(const Metrics m, rank.net->TakeMetrics());
    sum.loss_sum += m.loss_sum;
    sum.top1 += m.top1;
    sum.top5 += m.top5;
    sum.images += m.images;
  }
  if (!group_->world().multi()) return sum;
  // Every process's, added in rank order: the same figures everywhere.
  const double mine[4] = {sum.loss_sum, sum.top1, sum.top5, sum.images};
  std::vector<double> all(4 * static_cast<size_t>(group_->world_size()));
  TOPIARY_RETURN_IF_ERROR(group_->collective()->ExchangeHost(0, mine, sizeof(mine), all.data()));
  Metrics world;
  for (int r = 0; r < group_->world_size(); ++r) {
    world.loss_sum += all[4 * r];
    world.top1 += all[4 * r + 1];
    world.top5 += all[4 * r + 2];
    world.images += all[4 * r + 3];
  }
  return world;
}

}  // namespace topiary
