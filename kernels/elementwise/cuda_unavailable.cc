// The CUDA entry points of kernels/elementwise in a CPU-only build (see kernels/runtime/no_cuda.h).
#include "kernels/elementwise/activation.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/loss.h"
#include "kernels/elementwise/sgd.h"
#include "kernels/runtime/no_cuda.h"

namespace topiary::kernels {

absl::Status CopyCuda(int64_t, const void*, void*, const CudaContext&) { return NoCuda(); }
absl::Status ActivationForwardCuda(DType, const ActivationFn&, int64_t, const void*, void*,
                                   const CudaContext&) {
  return NoCuda();
}
absl::Status ActivationBackwardCuda(DType, const ActivationFn&, int64_t, const void*, const void*,
                                    void*, const CudaContext&) {
  return NoCuda();
}
absl::Status MulForwardCuda(DType, int64_t, int, int, const void*, const void*, void*,
                            const CudaContext&) {
  return NoCuda();
}
absl::Status MulBackwardCuda(DType, int64_t, int, int, const void*, const void*, const void*, void*,
                             void*, const CudaContext&) {
  return NoCuda();
}
absl::Status ReluForwardCuda(DType, int64_t, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status ReluBackwardCuda(DType, int64_t, const void*, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status Relu6ForwardCuda(DType, int64_t, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status Relu6BackwardCuda(DType, int64_t, const void*, const void*, void*,
                               const CudaContext&) {
  return NoCuda();
}
absl::Status ConcatChannelsCuda(DType, int64_t, int, int, int, const void*, void*,
                                const CudaContext&) {
  return NoCuda();
}
absl::Status SplitChannelsCuda(DType, int64_t, int, int, int, const void*, void*,
                               const CudaContext&) {
  return NoCuda();
}
absl::Status AddCuda(DType, int64_t, const void*, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddReluCuda(DType, int64_t, const void*, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddReluBackwardCuda(DType, int64_t, const void*, const void*, void*, void*,
                                 const CudaContext&) {
  return NoCuda();
}
absl::Status AddReluBackwardSumCuda(DType, int64_t, const void*, const void*, const void*, void*,
                                    void*, const CudaContext&) {
  return NoCuda();
}
absl::Status CastCuda(DType, DType, int64_t, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status CastManyCuda(DType, DType, const CastItem*, int, const CudaContext&) {
  return NoCuda();
}
absl::Status MeanRowsCuda(int, int64_t, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddBiasCuda(DType, int64_t, int, const float*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status CountZerosCuda(DType, int64_t, const void*, unsigned long long*, const CudaContext&) {
  return NoCuda();
}
absl::Status BiasGradCuda(DType, int64_t, int, const void*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status SgdStepCuda(const SgdParams&, const float*, const std::vector<SgdTensor>&,
                         const CudaContext&) {
  return NoCuda();
}
absl::Status SoftmaxCrossEntropyCuda(DType, int, int, const void*, const int32_t*, float, void*,
                                     float*, int32_t*, const CudaContext&) {
  return NoCuda();
}
absl::Status AccumulateMetricsCuda(int, const float*, const int32_t*, int, double*,
                                   const CudaContext&) {
  return NoCuda();
}

}  // namespace topiary::kernels
