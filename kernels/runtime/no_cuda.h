// The CUDA entry points of kernels/ in a CPU-only build (no toolkit when the build was
// configured): each family's cuda_unavailable.cc defines its entry points with this error. No
// CUDA device can be created in such a build, so they are unreachable from the trainer; they
// exist so that callers need no preprocessor conditions, and each says plainly why it cannot run.
#ifndef TOPIARY_KERNELS_RUNTIME_NO_CUDA_H_
#define TOPIARY_KERNELS_RUNTIME_NO_CUDA_H_

#include "absl/status/status.h"

namespace topiary::kernels {

inline absl::Status NoCuda() {
  return absl::FailedPreconditionError("this binary was built without CUDA");
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_NO_CUDA_H_
