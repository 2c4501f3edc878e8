#include "trainer/run/tensorboard.h"

#include <array>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "tensorboard/event.pb.h"
#include "trainer/spec/describe.h"
#include "trainer/util/crc32c.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

void PutLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string TensorBoardRunDir(const std::string& out_dir, const std::string& name) {
  std::string run;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    run += ok ? c : '_';
  }
  if (run.empty() || run == "." || run == "..") run = "run";
  return out_dir + "/tensorboard/" + run.substr(0, 100);
}

std::vector<std::pair<std::string, std::variant<std::string, double>>> HParamsOf(
    const topiary::v1::ExperimentSpec& spec, const std::string& experiment_id) {
  const auto& p = spec.pruning();
  return {
      {"name", spec.name()},
      {"experiment", experiment_id.empty() ? std::string("-") : experiment_id},
      {"model", spec.model().arch().empty() ? std::string("(checkpoint's)") : spec.model().arch()},
      {"method", DescribeMethod(spec)},
      {"target", spec.has_pruning() ? (p.target_flops() > 0 ? p.target_flops() : p.target()) : 0.0},
      {"block", spec.has_pruning() && p.method() == topiary::v1::PruningSpec::BLOCK
                    ? absl::StrCat(p.block_in(), "x", p.block_out())
                    : std::string("-")},
      {"multiplier", DescribeMultiplier(spec)},
      {"weight_code", DescribeWeightCode(spec)},
      {"parent", DescribeParent(spec.init_from_checkpoint())},
      {"lr", spec.train().optimizer().lr()},
      {"epochs", static_cast<double>(spec.train().epochs())},
      {"precision", topiary::v1::TrainSpec::Precision_Name(spec.train().precision())},
  };
}

TensorBoardWriter::TensorBoardWriter(std::string dir) {
  path_ = dir + "/events.out.tfevents.topiaryd";
  if (absl::Status st = MakeDirs(dir); !st.ok()) Report(st);
  if (!PathExists(path_)) {
    fresh_ = true;
    topiary::tensorboard::Event first;
    first.set_wall_time(static_cast<double>(std::time(nullptr)));
    first.set_file_version("brain.Event:2");
    Frame(first.SerializeAsString());
    Flush();
  }
}

void TensorBoardWriter::Frame(const std::string& record) {
  std::string length;
  PutLittleEndian(&length, record.size(), 8);
  pending_ += length;
  PutLittleEndian(&pending_, MaskCrc(Crc32c(length.data(), 8)), 4);
  pending_ += record;
  PutLittleEndian(&pending_, MaskCrc(Crc32c(record.data(), record.size())), 4);
}

void TensorBoardWriter::Flush() {
  if (pending_.empty()) return;
  if (absl::Status st = AppendToFile(path_, pending_, /*sync=*/false); !st.ok()) Report(st);
  pending_.clear();
}

void TensorBoardWriter::Report(const absl::Status& st) {
  // Metrics are a convenience beside the event log: a run goes on without them, and the
  // reason is said once.
  if (reported_) return;
  reported_ = true;
  std::fprintf(stderr, "topiary: TensorBoard file left out: %s\n",
               std::string(st.message()).c_str());
}

void TensorBoardWriter::Scalar(const std::string& tag, int64_t step, double value) {
  topiary::tensorboard::Event e;
  e.set_wall_time(static_cast<double>(std::time(nullptr)));
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  Frame(e.SerializeAsString());
}

void TensorBoardWriter::HParamsRecord(const std::string& tag, const std::string& data) {
  topiary::tensorboard::Event e;
  e.set_wall_time(static_cast<double>(std::time(nullptr)));
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* plugin = v->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name("hparams");
  plugin->set_content(data);
  v->mutable_tensor()->set_dtype(1);  // DT_FLOAT 0, as TensorBoard's own hparams summaries
  v->mutable_tensor()->mutable_tensor_shape();
  v->mutable_tensor()->add_float_val(0);
  Frame(e.SerializeAsString());
}

void TensorBoardWriter::StartSession(
    const std::vector<std::pair<std::string, std::variant<std::string, double>>>& hparams) {
  if (!fresh_) return;  // a resumed run: the session started in an earlier process
  topiary::tensorboard::HParamsPluginData data;
  auto* start = data.mutable_session_start_info();
  start->set_start_time_secs(static_cast<double>(std::time(nullptr)));
  for (const auto& [name, value] : hparams) {
    auto& v = (*start->mutable_hparams())[name];
    if (const auto* text = std::get_if<std::string>(&value)) {
      v.set_string_value(*text);
    } else {
      v.set_number_value(std::get<double>(value));
    }
  }
  HParamsRecord("_hparams_/session_start_info", data.SerializeAsString());
  Flush();
}

void TensorBoardWriter::Write(const topiary::v1::Event& event) {
  if (event.has_progress()) {
    const auto& p = event.progress();
    Scalar("train/loss", p.step(), p.loss());
    Scalar("train/lr", p.step(), p.lr());
    Scalar("train/images_per_s", p.step(), p.images_per_s());
  } else if (event.has_epoch()) {
    ++epoch_;
    const auto& ep = event.epoch();
    if (ep.evaluated() && ep.val_loss() > 0) {
      Scalar("val/top1", epoch_, ep.val_top1());
      Scalar("val/loss", epoch_, ep.val_loss());
    } else if (ep.evaluated()) {
      Scalar("test/top1", epoch_, ep.test_top1());
      Scalar("test/loss", epoch_, ep.test_loss());
    }
    // Board energy (NVML) where the run measures it.
    if (ep.train_joules_per_image() > 0) {
      Scalar("energy/train_joules_per_image", epoch_, ep.train_joules_per_image());
    }
    if (ep.test_joules_per_image() > 0) {
      Scalar("energy/test_joules_per_image", epoch_, ep.test_joules_per_image());
    }
  } else if (event.has_round()) {
    const auto& r = event.round();
    Scalar("round/sparsity", r.round(), r.sparsity());
    // With a validation set, rounds are judged on it; only round 0 also has a test figure.
    if (r.val_loss() > 0) Scalar("round/val_top1", r.round(), r.val_top1());
    if (r.val_loss() == 0 || r.test_loss() > 0) {
      Scalar("round/test_top1", r.round(), r.test_top1());
    }
    for (const auto& layer : r.layers()) {
      Scalar("layer_sparsity/" + layer.layer(), r.round(), layer.sparsity());
    }
  } else if (event.has_summary()) {
    const auto& s = event.summary();
    const auto state = s.state();
    if (state == topiary::v1::SUCCEEDED || state == topiary::v1::FAILED ||
        state == topiary::v1::CANCELLED) {
      Scalar("final/test_top1", epoch_, s.test_top1());
      Scalar("final/test_loss", epoch_, s.test_loss());
      Scalar("final/sparsity", epoch_, s.sparsity());
      if (s.dense_top1() > 0) Scalar("final/dense_top1", epoch_, s.dense_top1());
      if (s.val_loss() > 0) Scalar("final/val_top1", epoch_, s.val_top1());
      topiary::tensorboard::HParamsPluginData data;
      auto* end = data.mutable_session_end_info();
      end->set_status(state == topiary::v1::SUCCEEDED ? 1 : 2);  // STATUS_SUCCESS, _FAILURE
      end->set_end_time_secs(static_cast<double>(std::time(nullptr)));
      HParamsRecord("_hparams_/session_end_info", data.SerializeAsString());
    }
  }
  Flush();  // one write per event, however many scalars it carries
}

}  // namespace topiary
