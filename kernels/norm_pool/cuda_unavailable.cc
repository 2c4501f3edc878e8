// The CUDA entry points of kernels/norm_pool in a CPU-only build (see kernels/runtime/no_cuda.h).
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/norm_pool/pooling.h"
#include "kernels/norm_pool/residual_tail.h"
#include "kernels/runtime/no_cuda.h"

namespace topiary::kernels {

size_t BatchNormWorkspaceFloatsCuda(const BatchNormShape&, int) { return 0; }
absl::Status BatchNormForwardTrainCuda(DType, const BatchNormShape&, const void*, const float*,
                                       const float*, float*, float*, float*, float*, float*, void*,
                                       float*, const CudaContext&, BatchNormSync*,
                                       const BatchNormMoments*) {
  return NoCuda();
}
absl::Status BatchNormForwardEvalCuda(DType, const BatchNormShape&, const void*, const float*,
                                      const float*, const float*, const float*, void*,
                                      const CudaContext&) {
  return NoCuda();
}
absl::Status BatchNormBackwardCuda(DType, const BatchNormShape&, const void*, const void*,
                                   const float*, const float*, const float*, const float*, void*,
                                   float*, float*, float*, const CudaContext&, BatchNormSync*) {
  return NoCuda();
}
absl::Status BatchNormFoldEvalCuda(const BatchNormShape&, const float*, const float*, const float*,
                                   const float*, float*, const CudaContext&) {
  return NoCuda();
}
bool ResidualTailFusableCuda(DType, int) { return false; }
size_t ResidualTailWorkspaceFloatsCuda(const ResidualTailShape&, int) { return 0; }
absl::Status ResidualTailForwardCuda(DType, const ResidualTailShape&, const FoldedBatchNorm&,
                                     const FoldedBatchNorm&, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status ResidualTailBackwardCuda(DType, const ResidualTailShape&, const void*, const void*,
                                      const void*, const FoldedBatchNorm&, const FoldedBatchNorm&,
                                      void*, float*, const CudaContext&, BatchNormSync*) {
  return NoCuda();
}
absl::Status MaxPoolForwardCuda(DType, const PoolShape&, const void*, void*, uint8_t*,
                                const CudaContext&) {
  return NoCuda();
}
absl::Status MaxPoolBackwardCuda(DType, const PoolShape&, const uint8_t*, const void*, void*,
                                 const CudaContext&) {
  return NoCuda();
}
absl::Status AvgPoolForwardCuda(DType, const PoolShape&, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status AvgPoolBackwardCuda(DType, const PoolShape&, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status GlobalAvgPoolForwardCuda(DType, int, int, int, const void*, void*,
                                      const CudaContext&) {
  return NoCuda();
}
absl::Status GlobalAvgPoolBackwardCuda(DType, int, int, int, const void*, void*,
                                       const CudaContext&) {
  return NoCuda();
}

}  // namespace topiary::kernels
