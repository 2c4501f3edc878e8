// TensorBoard event files of an experiment's metrics: TFRecord framing (length, masked
// CRC-32C of the length, the record, masked CRC-32C of the record) around Event protos with
// scalar summaries, and the HParams dashboard's records: the run's hyperparameters when it
// starts (method, target, block, multiplier, weight code, parent, ...) and its status when it
// ends, beside final/* metrics. Each run writes into OUT/tensorboard/<its name>, so
// `tensorboard --logdir DATA_DIR/experiments` lists runs as exp-0007/tensorboard/<name>.
#ifndef TOPIARY_TRAINER_RUN_TENSORBOARD_H_
#define TOPIARY_TRAINER_RUN_TENSORBOARD_H_

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "topiary/v1/events.pb.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/util/crc32c.h"

namespace topiary {

// TFRecord's masking of a CRC-32C (trainer/util/crc32c.h).
uint32_t MaskCrc(uint32_t crc);

// The folder of a run's event file under OUT/tensorboard: its name, made safe for a path.
std::string TensorBoardRunDir(const std::string& out_dir, const std::string& name);

// The HParams dashboard's hyperparameters of a run: name -> text or number.
std::vector<std::pair<std::string, std::variant<std::string, double>>> HParamsOf(
    const topiary::v1::ExperimentSpec& spec, const std::string& experiment_id);

class TensorBoardWriter {
 public:
  // Appends to (or creates) `dir`/events.out.tfevents.topiaryd.
  explicit TensorBoardWriter(std::string dir);
  // The HParams session start (written once per file: a resumed run keeps its first).
  void StartSession(
      const std::vector<std::pair<std::string, std::variant<std::string, double>>>& hparams);
  // Writes the scalars a run event carries: train/loss, train/lr, train/images_per_s
  // (progress, by optimizer step); test/top1, test/loss (evaluated epochs, by epoch);
  // round/sparsity, round/test_top1 and layer_sparsity/<layer> (rounds, by round);
  // final/test_top1, final/test_loss, final/sparsity, final/dense_top1 and the HParams
  // session's end (the summary of a run that ended; a paused one goes on later).
  void Write(const topiary::v1::Event& event);
  const std::string& path() const { return path_; }

 private:
  void Scalar(const std::string& tag, int64_t step, double value);
  // A summary the hparams plugin reads: `data` (HParamsPluginData) under `tag`.
  void HParamsRecord(const std::string& tag, const std::string& data);
  // Frames a record into pending_; Flush appends what is pending to the file in one write.
  void Frame(const std::string& record);
  void Flush();
  void Report(const absl::Status& st);
  std::string path_;
  std::string pending_;
  bool reported_ = false;
  int epoch_ = 0;
  bool fresh_ = false;  // the file was made by this writer (a resumed run appends)
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_TENSORBOARD_H_
