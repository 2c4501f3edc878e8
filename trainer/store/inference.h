// A checkpoint opened to run its network without training: `topiary evaluate`, sensitivity
// and ONNX export open it here, so the file is read, checked and parsed once, the model
// built only as large as the file's weights, and the approximation applied before the
// weights are loaded (a moving-average activation range is a parameter the file may hold).
#ifndef TOPIARY_TRAINER_STORE_INFERENCE_H_
#define TOPIARY_TRAINER_STORE_INFERENCE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/store/checkpoint.h"

namespace topiary {

struct InferenceCheckpoint {
  CheckpointFile file;
  topiary::v1::ExperimentSpec spec;  // the file's spec, parsed, with defaults filled in
};

// Errors name `path`: the file's (OpenCheckpoint), or a spec that does not parse.
absl::StatusOr<InferenceCheckpoint> OpenForInference(const std::string& path);

// A fresh model of the checkpoint's network (BuildCheckpointModel at the spec's width) for
// images `input` (its n is ignored) into `classes` classes on `device`; with `load`, the
// file's weights and masks loaded (no optimizer state) after `approximation` (when not null)
// is applied.
absl::StatusOr<std::unique_ptr<Model>> InferenceModel(
    const InferenceCheckpoint& checkpoint, Shape4 input, int classes, Device* device, bool load,
    const topiary::v1::ApproximationSpec* approximation = nullptr);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_STORE_INFERENCE_H_
