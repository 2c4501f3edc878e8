#include "trainer/store/inference.h"

#include "absl/strings/str_cat.h"
#include "trainer/approx/approximation.h"
#include "trainer/spec/spec.h"
#include "util/status_macros.h"

namespace topiary {

absl::StatusOr<InferenceCheckpoint> OpenForInference(const std::string& path) {
  InferenceCheckpoint out;
  TOPIARY_ASSIGN_OR_RETURN(out.file, OpenCheckpoint(path));
  TOPIARY_ASSIGN_OR_RETURN(auto spec, ParseSpec(out.file.state.spec_text, path + " (its spec)"));
  out.spec = WithDefaults(spec);
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> InferenceModel(
    const InferenceCheckpoint& checkpoint, Shape4 input, int classes, Device* device, bool load,
    const topiary::v1::ApproximationSpec* approximation) {
  const CheckpointFile& file = checkpoint.file;
  TOPIARY_ASSIGN_OR_RETURN(
      auto model, BuildCheckpointModel(file.state, file.path, checkpoint.spec.model().width(),
                                       input, classes, device));
  if (approximation != nullptr && approximation->rules_size() > 0) {
    TOPIARY_RETURN_IF_ERROR(ApplyApproximation(*approximation, model.get()));
  }
  if (load) TOPIARY_RETURN_IF_ERROR(LoadCheckpoint(file, model.get(), false).status());
  return model;
}

}  // namespace topiary
