#include "trainer/runner.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/loss.h"
#include "trainer/dataset.h"
#include "trainer/events.h"
#include "trainer/file_util.h"
#include "trainer/lr_schedule.h"
#include "trainer/model_zoo.h"
#include "trainer/optimizer.h"
#include "trainer/spec.h"

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
  auto train_net = Network::Plan(model->get(), batch, true);
  if (!train_net.ok()) return train_net.status();
  auto eval_net = Network::Plan(model->get(), spec.data().eval_batch_size(), false);
  if (!eval_net.ok()) return eval_net.status();

  const Normalization norm =
      ComputeNormalization(data->train, data->max_value, spec.data().normalize());
  const Batcher train_batcher(&data->train, data->max_value, norm, spec.data().augment(),
                              spec.seed());
  const Batcher test_batcher(&data->test, data->max_value, norm, {}, spec.seed());
  const bool augment =
      spec.data().augment().crop_padding() > 0 || spec.data().augment().horizontal_flip();
  SgdOptimizer optimizer((*model)->parameters(), spec.train().optimizer());

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

  std::vector<int32_t> labels(batch);
  const auto& lr_spec = spec.train().lr_schedule();
  const float smoothing = spec.train().label_smoothing();
  double train_seconds = 0;
  int64_t images_trained = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const Clock::time_point epoch_start = Clock::now();
    const std::vector<int32_t> order = train_batcher.EpochOrder(epoch);
    Philox aug_rng = train_batcher.AugmentStream(epoch);
    double loss_sum = 0, window_loss = 0;
    int64_t correct = 0;
    int window_steps = 0;
    Clock::time_point last_progress = Clock::now();
    double lr = 0;
    for (int step = 0; step < steps_per_epoch; ++step) {
      // The rate at the end of this step, so warm-up never uses a rate of exactly zero.
      lr = LearningRate(lr_spec, spec.train().optimizer().lr(),
                        epoch + (step + 1.0) / steps_per_epoch, epochs);
      train_batcher.Assemble(order, static_cast<int64_t>(step) * batch, batch, augment, &aug_rng,
                             (*train_net)->input(), labels.data());
      (*train_net)->Forward(true);
      const double loss = (*train_net)->Loss(labels.data(), smoothing);
      correct +=
          kernels::TopKCorrectCpu(batch, data->classes, (*train_net)->logits(), labels.data(), 1);
      (*train_net)->Backward();
      optimizer.Step(static_cast<float>(lr));
      if (!std::isfinite(loss)) {
        return absl::InternalError(absl::StrFormat(
            "training diverged: loss is %f at epoch %d, step %d (lower train.optimizer.lr)", loss,
            epoch + 1, step + 1));
      }
      loss_sum += loss;
      window_loss += loss;
      ++window_steps;
      const bool last = step + 1 == steps_per_epoch;
      if (Seconds(last_progress) >= sink.progress_interval_s() || last) {
        const double elapsed = train_seconds + Seconds(epoch_start);
        const int64_t done = images_trained + static_cast<int64_t>(step + 1) * batch;
        const int64_t total = static_cast<int64_t>(epochs) * steps_per_epoch * batch;
        Event e = sink.New();
        auto* p = e.mutable_progress();
        p->set_epoch(epoch + 1);
        p->set_epochs(epochs);
        p->set_step(static_cast<int32_t>(optimizer.steps()));
        p->set_images_done((step + 1) * batch);
        p->set_images_total(steps_per_epoch * batch);
        p->set_loss(window_loss / window_steps);
        p->set_lr(lr);
        p->set_images_per_s(done / std::max(elapsed, 1e-9));
        p->set_eta_s(elapsed / done * (total - done));
        sink.Emit(e);
        window_loss = 0;
        window_steps = 0;
        last_progress = Clock::now();
      }
    }
    const double epoch_seconds = Seconds(epoch_start);
    train_seconds += epoch_seconds;
    images_trained += static_cast<int64_t>(steps_per_epoch) * batch;

    Event e = sink.New();
    auto* es = e.mutable_epoch();
    es->set_epoch(epoch + 1);
    es->set_train_loss(loss_sum / steps_per_epoch);
    es->set_train_top1(static_cast<double>(correct) /
                       (static_cast<double>(steps_per_epoch) * batch));
    es->set_lr(lr);
    es->set_seconds(epoch_seconds);
    es->set_images_per_s(steps_per_epoch * batch / epoch_seconds);
    const bool last_epoch = epoch + 1 == epochs;
    if (last_epoch || (epoch + 1) % spec.train().eval_every_epochs() == 0) {
      const EvalResult r = Evaluate(**eval_net, test_batcher, data->test, data->classes);
      es->set_evaluated(true);
      es->set_test_loss(r.loss);
      es->set_test_top1(r.top1);
      es->set_test_top5(r.top5);
      summary->set_test_loss(r.loss);
      summary->set_test_top1(r.top1);
      summary->set_test_top5(r.top5);
    }
    summary->set_epochs(epoch + 1);
    sink.Emit(e);
  }
  if (epochs == 0) {
    const EvalResult r = Evaluate(**eval_net, test_batcher, data->test, data->classes);
    summary->set_test_loss(r.loss);
    summary->set_test_top1(r.top1);
    summary->set_test_top5(r.top5);
  }
  summary->set_train_images_per_s(train_seconds > 0 ? images_trained / train_seconds : 0);
  return absl::OkStatus();
}

}  // namespace

EvalResult Evaluate(Network& net, const Batcher& batcher, const ImageSet& set, int classes) {
  EvalResult r;
  const int batch = net.batch();
  std::vector<int32_t> order(set.size());
  for (int64_t i = 0; i < set.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::vector<int32_t> labels(batch);
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0;
  for (int64_t first = 0; first < set.size(); first += batch) {
    const int count = static_cast<int>(std::min<int64_t>(batch, set.size() - first));
    // Rows past `count` keep the previous batch's images: inference treats each image on
    // its own, so they cannot affect the real ones, and they are not counted.
    batcher.Assemble(order, first, count, false, nullptr, net.input(), labels.data());
    net.Forward(false);
    loss_sum += kernels::SoftmaxCrossEntropyCpu(count, classes, net.logits(), labels.data(), 0.0f,
                                                nullptr) *
                count;
    top1 += kernels::TopKCorrectCpu(count, classes, net.logits(), labels.data(), 1);
    top5 +=
        kernels::TopKCorrectCpu(count, classes, net.logits(), labels.data(), std::min(5, classes));
  }
  r.images = set.size();
  r.loss = loss_sum / set.size();
  r.top1 = static_cast<double>(top1) / set.size();
  r.top5 = static_cast<double>(top5) / set.size();
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
