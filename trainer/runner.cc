#include "trainer/runner.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/status_macros.h"
#include "trainer/dataset.h"
#include "trainer/device_batches.h"
#include "trainer/events.h"
#include "trainer/file_util.h"
#include "trainer/lr_schedule.h"
#include "trainer/model_zoo.h"
#include "trainer/optimizer.h"
#include "trainer/spec.h"
#include "trainer/step_runner.h"

namespace topiary {
namespace {

using topiary::v1::Event;
using topiary::v1::ExperimentSpec;
using topiary::v1::RunSummary;
using Clock = std::chrono::steady_clock;

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!partial.empty() && !IsDirectory(partial) && ::mkdir(partial.c_str(), 0755) != 0) {
        return absl::PermissionDeniedError(absl::StrCat("--out: cannot create folder ", partial));
      }
    }
    if (i < path.size()) partial += path[i];
  }
  return absl::OkStatus();
}

// Numbers events and hands them to the callback and the events file.
class EventSink {
 public:
  EventSink(const RunOptions& options, Clock::time_point start) : options_(options), start_(start) {
    if (!options.out_dir.empty()) file_.open(options.out_dir + "/events.jsonl", std::ios::trunc);
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
    if (options_.on_event) options_.on_event(e);
  }

 private:
  const RunOptions& options_;
  Clock::time_point start_;
  std::ofstream file_;
  uint32_t seq_ = 0;
};

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The dense phase: everything after validation. Fills `summary` as it goes.
absl::Status Run(const ExperimentSpec& spec, EventSink& sink, RunSummary* summary) {
  if (spec.has_pruning()) {
    return absl::UnimplementedError(
        "pruning: pruning rounds are not available in this version yet (dense training only); "
        "remove the pruning block");
  }
  if (!spec.init_from_checkpoint().empty()) {
    return absl::UnimplementedError(
        "init_from_checkpoint: checkpoints are not available in this version yet");
  }
  auto device = CreateDevice(spec.device());
  if (!device.ok()) return device.status();
  summary->set_device((*device)->name());

  auto data = LoadDataset(spec.data(), spec.seed());
  if (!data.ok()) return data.status();
  const int batch = spec.data().batch_size();
  if (data->train.size() < batch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data.batch_size: %d exceeds the %d training images", batch, data->train.size()));
  }
  if (data->test.size() == 0) return absl::InvalidArgumentError("data: the test set is empty");

  const Shape4 input{1, data->train.h, data->train.w, data->train.c};
  auto model =
      BuildModel(spec.model().arch(), spec.model().width(), input, data->classes, device->get());
  if (!model.ok()) return model.status();
  (*model)->Initialize(spec.seed());
  PlanOptions plan_options;
  plan_options.tf32 = spec.train().precision() == topiary::v1::TrainSpec::TF32;
  plan_options.deterministic = spec.device().deterministic();
  auto train_net = Network::Plan(model->get(), batch, true, plan_options);
  if (!train_net.ok()) return train_net.status();
  auto eval_net = Network::Plan(model->get(), spec.data().eval_batch_size(), false, plan_options);
  if (!eval_net.ok()) return eval_net.status();

  const Normalization norm =
      ComputeNormalization(data->train, data->max_value, spec.data().normalize());
  const Batcher train_batcher(&data->train, data->max_value, norm, spec.data().augment(),
                              spec.seed());
  const Batcher test_batcher(&data->test, data->max_value, norm, {}, spec.seed());
  const bool augment = train_batcher.augments();
  SgdOptimizer optimizer((*model)->parameters(), spec.train().optimizer(), device->get());

  const int epochs = spec.train().epochs();
  const int steps_per_epoch = static_cast<int>(data->train.size() / batch);
  {
    Event e = sink.New();
    auto* s = e.mutable_started();
    s->set_name(spec.name());
    s->set_model_arch(spec.model().arch());
    s->set_device((*device)->name());
    s->set_dataset(data->name);
    s->set_train_images(static_cast<int32_t>(data->train.size()));
    s->set_test_images(static_cast<int32_t>(data->test.size()));
    s->set_parameters(static_cast<int32_t>((*model)->trainable_parameter_count()));
    s->set_epochs(epochs);
    s->set_batch_size(batch);
    sink.Emit(e);
  }

  // The learning rate of every step of the run, evaluated at the end of each step so that a
  // warm-up never uses a rate of exactly zero.
  const auto& lr_spec = spec.train().lr_schedule();
  std::vector<float> lr_table(static_cast<size_t>(epochs) * steps_per_epoch);
  for (size_t t = 0; t < lr_table.size(); ++t) {
    lr_table[t] = static_cast<float>(
        LearningRate(lr_spec, spec.train().optimizer().lr(), (t + 1.0) / steps_per_epoch, epochs));
  }
  auto clock = TrainingClock::Create(device->get(), lr_table);
  if (!clock.ok()) return clock.status();
  auto train_data = DeviceBatches::Create(&train_batcher, device->get());
  if (!train_data.ok()) return train_data.status();
  auto test_data = DeviceBatches::Create(&test_batcher, device->get());
  if (!test_data.ok()) return test_data.status();
  std::vector<int32_t> identity(data->test.size());
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int32_t>(i);
  TOPIARY_RETURN_IF_ERROR(test_data->SetOrder(identity));

  Network& net = **train_net;
  const float smoothing = spec.train().label_smoothing();
  // One training step, enqueued; everything that varies per step is read from the clock.
  auto step_fn = [&]() -> absl::Status {
    TOPIARY_RETURN_IF_ERROR(clock->Tick(batch));
    TOPIARY_RETURN_IF_ERROR(
        train_data->Assemble(clock->clock(), 0, 0, batch, augment, net.input(), net.labels()));
    TOPIARY_RETURN_IF_ERROR(net.Forward(true));
    TOPIARY_RETURN_IF_ERROR(net.Loss(smoothing));
    TOPIARY_RETURN_IF_ERROR(net.Backward());
    return optimizer.Step(clock->clock());
  };
  // On a GPU the step is captured as a CUDA graph after one eager step and replayed.
  StepRunner steps((*device).get(), step_fn,
                   spec.device().cuda_graphs() != topiary::v1::DeviceSpec::GRAPHS_OFF,
                   /*eager_steps=*/1);
  double train_seconds = 0;
  int64_t images_trained = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const Clock::time_point epoch_start = Clock::now();
    TOPIARY_RETURN_IF_ERROR(train_data->SetOrder(train_batcher.EpochOrder(epoch)));
    TOPIARY_RETURN_IF_ERROR(
        clock->BeginEpoch(epoch, static_cast<int64_t>(epoch) * steps_per_epoch));
    Metrics epoch_metrics;
    Clock::time_point last_progress = Clock::now();
    for (int step = 0; step < steps_per_epoch; ++step) {
      TOPIARY_RETURN_IF_ERROR(steps.Run());
      const bool last = step + 1 == steps_per_epoch;
      if (!last && Seconds(last_progress) < sink.progress_interval_s()) continue;
      // Reading the metrics waits for the device: only at progress intervals.
      auto window = net.TakeMetrics();
      if (!window.ok()) return window.status();
      epoch_metrics.loss_sum += window->loss_sum;
      epoch_metrics.top1 += window->top1;
      epoch_metrics.images += window->images;
      if (!std::isfinite(window->loss_sum)) {
        return absl::InternalError(absl::StrFormat(
            "training diverged: loss is %f at epoch %d, step %d (lower train.optimizer.lr)",
            window->loss(), epoch + 1, step + 1));
      }
      const double elapsed = train_seconds + Seconds(epoch_start);
      const int64_t done = images_trained + static_cast<int64_t>(step + 1) * batch;
      const int64_t total = static_cast<int64_t>(epochs) * steps_per_epoch * batch;
      const int64_t run_step = static_cast<int64_t>(epoch) * steps_per_epoch + step;
      Event e = sink.New();
      auto* p = e.mutable_progress();
      p->set_epoch(epoch + 1);
      p->set_epochs(epochs);
      p->set_step(static_cast<int32_t>(run_step + 1));
      p->set_images_done((step + 1) * batch);
      p->set_images_total(steps_per_epoch * batch);
      p->set_loss(window->loss());
      p->set_lr(clock->lr(run_step));
      p->set_images_per_s(done / std::max(elapsed, 1e-9));
      p->set_eta_s(elapsed / done * (total - done));
      sink.Emit(e);
      last_progress = Clock::now();
    }
    const double epoch_seconds = Seconds(epoch_start);
    train_seconds += epoch_seconds;
    images_trained += static_cast<int64_t>(steps_per_epoch) * batch;

    Event e = sink.New();
    auto* es = e.mutable_epoch();
    es->set_epoch(epoch + 1);
    es->set_train_loss(epoch_metrics.loss());
    es->set_train_top1(epoch_metrics.top1_rate());
    es->set_lr(clock->lr(static_cast<int64_t>(epoch + 1) * steps_per_epoch - 1));
    es->set_seconds(epoch_seconds);
    es->set_images_per_s(steps_per_epoch * batch / epoch_seconds);
    const bool last_epoch = epoch + 1 == epochs;
    if (last_epoch || (epoch + 1) % spec.train().eval_every_epochs() == 0) {
      auto r = Evaluate(**eval_net, *test_data, data->test.size());
      if (!r.ok()) return r.status();
      es->set_evaluated(true);
      es->set_test_loss(r->loss);
      es->set_test_top1(r->top1);
      es->set_test_top5(r->top5);
      summary->set_test_loss(r->loss);
      summary->set_test_top1(r->top1);
      summary->set_test_top5(r->top5);
    }
    summary->set_epochs(epoch + 1);
    sink.Emit(e);
  }
  if (epochs == 0) {
    auto r = Evaluate(**eval_net, *test_data, data->test.size());
    if (!r.ok()) return r.status();
    summary->set_test_loss(r->loss);
    summary->set_test_top1(r->top1);
    summary->set_test_top5(r->top5);
  }
  summary->set_train_images_per_s(train_seconds > 0 ? images_trained / train_seconds : 0);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EvalResult> Evaluate(Network& net, const DeviceBatches& data, int64_t images) {
  const int batch = net.batch();
  TOPIARY_RETURN_IF_ERROR(net.TakeMetrics().status());  // start from zero
  for (int64_t first = 0; first < images; first += batch) {
    const int count = static_cast<int>(std::min<int64_t>(batch, images - first));
    // Rows past `count` keep the previous batch's images: inference treats each image on
    // its own, so they cannot affect the real ones, and they are not counted.
    TOPIARY_RETURN_IF_ERROR(
        data.Assemble(nullptr, 0, first, count, false, net.input(), net.labels()));
    TOPIARY_RETURN_IF_ERROR(net.Forward(false));
    TOPIARY_RETURN_IF_ERROR(net.Loss(0.0f, count));
  }
  auto m = net.TakeMetrics();
  if (!m.ok()) return m.status();
  EvalResult r;
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
    if (status.ok())
      status = WriteFileAtomic(options.out_dir + "/spec.textproto", SpecToText(spec));
  }
  EventSink sink(options, start);
  if (status.ok()) status = Run(spec, sink, &summary);
  summary.set_state(status.ok() ? "SUCCEEDED" : "FAILED");
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
