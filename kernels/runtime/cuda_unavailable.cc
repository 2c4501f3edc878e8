// The CUDA entry points of kernels/runtime in a CPU-only build (see kernels/runtime/no_cuda.h).
#include "kernels/runtime/cuda_timing.h"
#include "kernels/runtime/no_cuda.h"
#include "kernels/runtime/step_clock.h"

namespace topiary::kernels {

absl::StatusOr<float> TimeOnStream(const std::function<absl::Status()>&, const CudaContext&, int,
                                   bool) {
  return NoCuda();
}
absl::StatusOr<float> TimeCaptured(const std::function<absl::Status()>&, const CudaContext&, int) {
  return NoCuda();
}
bool StreamCapturing(const CudaContext&) { return false; }
absl::Status TickCuda(StepClock*, const float*, int, const CudaContext&) { return NoCuda(); }

}  // namespace topiary::kernels
