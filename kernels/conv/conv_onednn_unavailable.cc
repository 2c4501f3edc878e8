// Builds without oneDNN (static binaries: Debian ships no libdnnl.a): the reference kernels
// of conv.h run every CPU convolution.
#include "kernels/conv/conv_onednn.h"

namespace topiary::kernels {

struct ConvOneDnnPlan::Impl {};

bool ConvOneDnnPlan::Enabled() { return false; }
absl::StatusOr<std::unique_ptr<ConvOneDnnPlan>> ConvOneDnnPlan::Create(const ConvShape&) {
  return absl::UnavailableError("this build has no oneDNN");
}
ConvOneDnnPlan::~ConvOneDnnPlan() = default;
absl::Status ConvOneDnnPlan::Forward(const float*, const float*, const float*, float*) {
  return absl::UnavailableError("this build has no oneDNN");
}
absl::Status ConvOneDnnPlan::BackwardData(const float*, const float*, float*) {
  return absl::UnavailableError("this build has no oneDNN");
}
absl::Status ConvOneDnnPlan::BackwardFilter(const float*, const float*, float*, float*) {
  return absl::UnavailableError("this build has no oneDNN");
}
std::string ConvOneDnnPlan::implementations() const { return ""; }

}  // namespace topiary::kernels
