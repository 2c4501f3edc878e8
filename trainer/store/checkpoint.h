// The HDF5 checkpoint store (every dataset and attribute, and what a reader checks, is
// documented in docs/checkpoint-format.md). A checkpoint holds the model's parameters (conv kernels
// OIHW on disk, KRSC in memory), masks, the optimizer's momentum, and the position of the run,
// which together let a run continue exactly where it stopped.
#ifndef TOPIARY_TRAINER_STORE_CHECKPOINT_H_
#define TOPIARY_TRAINER_STORE_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "topiary/v1/checkpoint.pb.h"
#include "topiary/v1/events.pb.h"
#include "topiary/v1/network.pb.h"
#include "trainer/nn/model.h"
#include "trainer/store/hdf5_file.h"

namespace topiary {

// Version 2 added the metadata checksum (root attribute metadata_crc32c).
inline constexpr int64_t kCheckpointFormatVersion = 2;
inline constexpr char kCheckpointFormat[] = "topiary-checkpoint";

// Where a run stands: the store saves and loads it whole, so a resumed run continues exactly
// (the same epoch order, learning rate and sampling decisions at every step).
struct RunPosition {
  int round = 0;                 // prune steps applied so far
  int epoch = 0;                 // training epochs completed (dense and fine-tuning)
  int phase_epoch = 0;           // epochs completed in the current phase (dense, or this round)
  int epoch_step = 0;            // steps completed in the epoch under way (a paused run)
  int64_t epoch_start_step = 0;  // optimizer steps completed when that epoch began
  // Optimizer steps completed (the file's global_step).
  int64_t global_step() const { return epoch_start_step + epoch_step; }
};

// Where a run stood when the checkpoint was written, and its provenance.
struct CheckpointState {
  std::string experiment_id;
  std::string parent;     // the checkpoint this experiment started from, if any
  std::string spec_text;  // the experiment's spec (text format, defaults filled in)
  std::string model_arch;
  std::string created_at;                  // ISO 8601, UTC (set by SaveCheckpoint)
  topiary::v1::CheckpointMetrics metrics;  // loss, top1, sparsity, the round table so far, ...
  std::optional<topiary::v1::InputFormat> input;  // what the network reads (absent: not recorded)
  // The network (trainer/nn/graph.h); absent in files written before checkpoints recorded it
  // (their network is the zoo's model_arch). Set by SaveCheckpoint.
  std::optional<topiary::v1::NetworkGraph> network;
  RunPosition position;
  uint64_t seed = 0;  // the experiment's seed (every random stream derives from it)
  // The float32 values the file stores under /layers (set by CheckpointStateOf; -1 when only
  // the root was read). A recorded network needing more parameters is refused before any is
  // allocated (BuildCheckpointModel): a small file cannot make a large model.
  int64_t stored_parameter_values = -1;
};

// The disk layout (conv kernels OIHW, everything else as in memory) of `n` host values of p
// laid out as in memory.
FloatArray ToDisk(const Parameter& p, const float* mem, size_t n);

// Writes the model (values, masks, momentum) and `state` to `path`, atomically (`mode`:
// replacing a file there, or only where none exists).
absl::Status SaveCheckpoint(const std::string& path, const Model& model, CheckpointState state,
                            WriteMode mode = WriteMode::kReplace);

// Reads `path` and checks that it is a Topiary checkpoint of a supported version. Errors
// name the file and the problem (missing, not HDF5, truncated, checksum, foreign, version).
absl::StatusOr<H5Document> ReadCheckpointFile(const std::string& path);
// The state `doc` (read from `path`) records. The JSON attributes (metrics, input, network)
// are parsed here, once: errors name the file and the attribute.
absl::StatusOr<CheckpointState> CheckpointStateOf(const H5Document& doc, const std::string& path);

// A checkpoint read whole and checked, with its state: what every reader of weights opens
// (runs starting from it, evaluation, export, fork), so the file is read and parsed once.
struct CheckpointFile {
  std::string path;
  H5Document doc;
  CheckpointState state;
};
absl::StatusOr<CheckpointFile> OpenCheckpoint(const std::string& path);

// The state of `path` without its tensors, for listings: the file's seal is checked (DATA_LOSS
// when damaged) but not the schema of every dataset; NOT_FOUND only when it is missing.
absl::StatusOr<CheckpointState> ReadCheckpointState(const std::string& path);

// Loads `path` into `model`: every parameter and mask, and the momentum when
// `with_optimizer`. The file is read and checked against the model completely (names,
// shapes, mask sizes) before anything is changed, so a failed load leaves the model as it was.
absl::StatusOr<CheckpointState> LoadCheckpoint(const std::string& path, Model* model,
                                               bool with_optimizer);
// The same, from a file already open.
absl::StatusOr<CheckpointState> LoadCheckpoint(const CheckpointFile& file, Model* model,
                                               bool with_optimizer);

// A fresh model (parameters created, not loaded) of the network `state` records, for images
// `input` and `classes` classes on `device`: the recorded graph, or, in a file without one,
// the zoo's state.model_arch at `width`. Errors name `path`, and say so when the graph
// reads other images or gives other classes than the caller's, or needs more parameter
// values than state.stored_parameter_values.
absl::StatusOr<std::unique_ptr<Model>> BuildCheckpointModel(const CheckpointState& state,
                                                            const std::string& path, float width,
                                                            Shape4 input, int classes,
                                                            Device* device);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_STORE_CHECKPOINT_H_
