// GPU discovery in a CPU-only build (no CUDA toolkit when the build was configured).
#include "trainer/core/device.h"

namespace topiary {

bool BuiltWithCuda() { return false; }

std::vector<GpuInfo> ListGpus(std::string* why_none) {
  if (why_none) *why_none = "this binary was built without CUDA";
  return {};
}

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal) {
  return absl::FailedPreconditionError("this binary was built without CUDA");
}

}  // namespace topiary
