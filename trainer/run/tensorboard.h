// TensorBoard event files of an experiment's metrics: TFRecord framing (length, masked
// CRC-32C of the length, the record, masked CRC-32C of the record) around Event protos with
// scalar summaries. `tensorboard --logdir DATA_DIR/experiments` shows every experiment.
#ifndef TOPIARY_TRAINER_RUN_TENSORBOARD_H_
#define TOPIARY_TRAINER_RUN_TENSORBOARD_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "topiary/v1/events.pb.h"
#include "trainer/util/crc32c.h"

namespace topiary {

// TFRecord's masking of a CRC-32C (trainer/util/crc32c.h).
uint32_t MaskCrc(uint32_t crc);

class TensorBoardWriter {
 public:
  // Appends to (or creates) `dir`/events.out.tfevents.topiaryd.
  explicit TensorBoardWriter(std::string dir);
  // Writes the scalars a run event carries: train/loss, train/lr, train/images_per_s
  // (progress, by optimizer step); test/top1, test/loss (evaluated epochs, by epoch);
  // round/sparsity, round/test_top1 (rounds, by round).
  void Write(const topiary::v1::Event& event);
  const std::string& path() const { return path_; }

 private:
  void Scalar(const std::string& tag, int64_t step, double value);
  // Frames a record into pending_; Flush appends what is pending to the file in one write.
  void Frame(const std::string& record);
  void Flush();
  void Report(const absl::Status& st);
  std::string path_;
  std::string pending_;
  bool reported_ = false;
  int epoch_ = 0;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_TENSORBOARD_H_
