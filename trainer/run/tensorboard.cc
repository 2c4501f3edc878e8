#include "trainer/run/tensorboard.h"

#include <array>
#include <cstdio>
#include <ctime>

#include "tensorboard/event.pb.h"
#include "trainer/util/crc32c.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

void PutLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

TensorBoardWriter::TensorBoardWriter(std::string dir) {
  path_ = dir + "/events.out.tfevents.topiaryd";
  if (absl::Status st = MakeDirs(dir); !st.ok()) Report(st);
  if (!PathExists(path_)) {
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

void TensorBoardWriter::Write(const topiary::v1::Event& event) {
  if (event.has_progress()) {
    const auto& p = event.progress();
    Scalar("train/loss", p.step(), p.loss());
    Scalar("train/lr", p.step(), p.lr());
    Scalar("train/images_per_s", p.step(), p.images_per_s());
  } else if (event.has_epoch()) {
    ++epoch_;
    const auto& ep = event.epoch();
    if (ep.evaluated()) {
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
    Scalar("round/sparsity", event.round().round(), event.round().sparsity());
    Scalar("round/test_top1", event.round().round(), event.round().test_top1());
  }
  Flush();  // one write per event, however many scalars it carries
}

}  // namespace topiary
