// The static build links no Gloo (Debian ships it as a shared library only): CPU ranks in
// separate processes need the default build.
#include "trainer/dist/collective.h"

namespace topiary {

absl::StatusOr<std::unique_ptr<Collective>> MakeGlooCollective(const World&, double) {
  return absl::FailedPreconditionError(
      "device.kind: CPU ranks in separate processes need Gloo, and this binary (the static "
      "build) was built without it; use the default build, or GPUs (NCCL)");
}

}  // namespace topiary
