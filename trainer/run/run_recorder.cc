#include "trainer/run/run_recorder.h"

#include "absl/strings/str_cat.h"
#include "trainer/run/events.h"
#include "util/status_macros.h"

namespace topiary {

using topiary::v1::Event;

double SecondsSince(RunClock::time_point since) {
  return std::chrono::duration<double>(RunClock::now() - since).count();
}

BoardEnergy::BoardEnergy(const std::vector<Device*>& devices, const std::string& names)
    : devices_(devices) {
  note_ = absl::StrCat("NVML board energy counter", devices.size() > 1 ? "s" : "", " of ", names);
  for (Device* d : devices) {
    auto meter = EnergyMeter::ForDevice(*d);
    if (!meter.ok()) {
      meters_.clear();
      note_ = std::string(meter.status().message());
      return;
    }
    meters_.push_back(std::move(*meter));
  }
}

absl::StatusOr<double> BoardEnergy::Joules() {
  if (meters_.empty()) return -1.0;
  double sum = 0;
  for (size_t r = 0; r < meters_.size(); ++r) {
    TOPIARY_RETURN_IF_ERROR(devices_[r]->Synchronize());  // the work so far, and no more
    auto j = meters_[r]->Joules();
    if (!j.ok()) return -1.0;  // a counter that stops answering only loses figures
    sum += *j;
  }
  return sum;
}

double BoardEnergy::AddTraining(double start, double end, int64_t images) {
  if (start < 0 || end < 0 || images <= 0) return 0;
  joules_ += end - start;
  images_ += images;
  return (end - start) / images;
}

RunRecorder::RunRecorder(const RunOptions& options, const topiary::v1::ExperimentSpec& spec,
                         RunClock::time_point start)
    : options_(options), start_(start) {
  summary_.set_out_dir(options.out_dir);
  if (!options.out_dir.empty() && options.write_event_log) {
    file_.open(options.out_dir + "/events.jsonl", std::ios::trunc);
  }
  // TensorBoard files beside the checkpoints, in a folder named by the run: `tensorboard
  // --logdir OUT_DIR` (topiaryd: DATA_DIR/experiments shows every experiment, and its HParams
  // dashboard compares them).
  if (!options.out_dir.empty()) {
    tensorboard_.emplace(TensorBoardRunDir(options.out_dir, spec.name()));
    tensorboard_->StartSession(HParamsOf(spec, options.experiment_id));
  }
}

Event RunRecorder::New() {
  Event e;
  e.set_seq(++seq_);
  e.set_time_s(SecondsSince(start_));
  return e;
}

void RunRecorder::Emit(const Event& e) {
  if (file_.is_open()) file_ << EventToJsonLine(e) << "\n" << std::flush;
  if (tensorboard_) tensorboard_->Write(e);
  if (options_.on_event) options_.on_event(e);
}

void RunRecorder::RecordEvaluation(const EvalResult& r) {
  summary_.set_test_joules_per_image(r.joules_per_image);
  metrics_.set_test_joules_per_image(r.joules_per_image);
  summary_.clear_conv_input_sparsity();
  metrics_.clear_conv_input_sparsity();
  for (const auto& [layer, zeros] : r.conv_input_zeros) {
    for (auto* list :
         {summary_.mutable_conv_input_sparsity(), metrics_.mutable_conv_input_sparsity()}) {
      auto* l = list->Add();
      l->set_layer(layer);
      l->set_zero_fraction(zeros);
    }
  }
  SetEvalFigures(r, &summary_);
  SetEvalFigures(r, &metrics_);
  if (!r.validation) summary_.set_test_top5(r.top5);
}

void RunRecorder::Finish(int epochs, double sparsity, double train_images_per_s) {
  summary_.set_epochs(epochs);
  summary_.set_dense_top1(metrics_.dense_top1());
  summary_.set_sparsity(sparsity);
  *summary_.mutable_rounds() = metrics_.rounds();
  if (metrics_.has_gradient_sampling()) {
    *summary_.mutable_gradient_sampling() = metrics_.gradient_sampling();
  }
  summary_.set_train_images_per_s(train_images_per_s);
  if (energy_) summary_.set_train_joules_per_image(energy_->train_joules_per_image());
}

}  // namespace topiary
