// Builds without CUDA have no NCCL: multi-GPU runs need the CUDA backend.
#include "trainer/dist/collective.h"

namespace topiary {

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(const std::vector<Device*>&, bool) {
  return absl::FailedPreconditionError("device.gpus: this binary was built without CUDA");
}

}  // namespace topiary
