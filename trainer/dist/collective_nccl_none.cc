// Builds without CUDA have no NCCL: multi-GPU runs need the CUDA backend.
#include "trainer/dist/collective.h"

namespace topiary {

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(const std::vector<Device*>&, bool) {
  return absl::FailedPreconditionError("device.gpus: this binary was built without CUDA");
}

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclWorldCollective(Device*, const World&, bool,
                                                                    double) {
  return absl::FailedPreconditionError("device.kind: this binary was built without CUDA");
}

}  // namespace topiary
