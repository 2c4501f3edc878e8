// The CUDA entry points of kernels/conv in a CPU-only build (see kernels/runtime/no_cuda.h).
#include "kernels/conv/conv.h"
#include "kernels/conv/direct_conv.h"
#include "kernels/conv/grouped_conv.h"
#include "kernels/conv/linear.h"
#include "kernels/conv/sampled_grad.h"
#include "kernels/conv/stem_conv.h"
#include "kernels/runtime/no_cuda.h"

namespace topiary::kernels {

bool DirectConvSupported(const ConvShape&, int) { return false; }
size_t DirectConvWorkspaceBytes(const ConvShape&, int, int) { return 0; }
absl::Status DirectConvForwardCuda(const ConvShape&, const float*, const float*, float*, bool,
                                   const CudaContext&) {
  return NoCuda();
}
absl::Status DirectConvBackwardDataCuda(const ConvShape&, const float*, const float*, float*, void*,
                                        bool, const CudaContext&) {
  return NoCuda();
}
absl::Status DirectConvBackwardFilterCuda(const ConvShape&, const float*, const float*, float*,
                                          void*, bool, const CudaContext&) {
  return NoCuda();
}
bool DirectConvBf16Supported(const ConvShape&, int) { return false; }
absl::Status DirectConvBackwardFilterBf16Cuda(const ConvShape&, const Bf16*, const Bf16*, Bf16*,
                                              void*, const CudaContext&) {
  return NoCuda();
}
absl::Status DirectConvForwardBf16Cuda(const ConvShape&, const Bf16*, const Bf16*, Bf16*,
                                       const CudaContext&) {
  return NoCuda();
}
absl::Status DirectConvBackwardDataBf16Cuda(const ConvShape&, const Bf16*, const Bf16*, Bf16*,
                                            void*, const CudaContext&) {
  return NoCuda();
}
bool StemConvSupported(const ConvShape&, int) { return false; }
size_t StemConvWorkspaceBytes(const ConvShape&, int, int) { return 0; }
absl::Status StemConvForwardCuda(const ConvShape&, const Bf16*, const Bf16*, Bf16*,
                                 const CudaContext&) {
  return NoCuda();
}
absl::Status StemConvBackwardFilterCuda(const ConvShape&, const Bf16*, const Bf16*, Bf16*, void*,
                                        const CudaContext&) {
  return NoCuda();
}
absl::Status GroupedConvForwardCuda(DType, const GroupedConvShape&, const void*, const float*,
                                    const float*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status GroupedConvBackwardDataCuda(DType, const GroupedConvShape&, const void*, const float*,
                                         void*, const CudaContext&) {
  return NoCuda();
}
absl::Status GroupedConvBackwardFilterCuda(DType, const GroupedConvShape&, const void*, const void*,
                                           float*, const CudaContext&) {
  return NoCuda();
}
size_t SampledWeightGradWorkspaceBytes(const ConvShape&, int) { return 0; }
absl::Status SampledWeightGradCuda(DType, const ConvShape&, const WeightGradSampling&, const void*,
                                   const void*, const uint8_t*, void*, float*, void*,
                                   const CudaContext&) {
  return NoCuda();
}
absl::Status LinearForwardCuda(DType, const LinearShape&, const void*, const void*, const float*,
                               void*, const CudaContext&) {
  return NoCuda();
}
absl::Status LinearBackwardDataCuda(DType, const LinearShape&, const void*, const void*, void*,
                                    const CudaContext&) {
  return NoCuda();
}
absl::Status LinearBackwardFilterCuda(DType, const LinearShape&, const void*, const void*, void*,
                                      float*, const CudaContext&) {
  return NoCuda();
}
struct ConvCudaPlan::Descriptors {};
absl::StatusOr<std::unique_ptr<ConvCudaPlan>> ConvCudaPlan::Create(const ConvShape&, Precision,
                                                                   size_t, bool, const CudaContext&,
                                                                   const ConvSearch&) {
  return NoCuda();
}
std::string ConvDeviceIdentity(const CudaContext&) { return ""; }
ConvCudaPlan::~ConvCudaPlan() = default;
absl::Status ConvCudaPlan::RunPass(int, const void*, const void*, void*, void*,
                                   const CudaContext&) const {
  return NoCuda();
}
absl::Status ConvCudaPlan::Forward(const void*, const void*, const float*, void*, void*,
                                   const CudaContext&) const {
  return NoCuda();
}
absl::Status ConvCudaPlan::BackwardData(const void*, const void*, void*, void*,
                                        const CudaContext&) const {
  return NoCuda();
}
absl::Status ConvCudaPlan::BackwardFilter(const void*, const void*, void*, float*, void*,
                                          const CudaContext&) const {
  return NoCuda();
}

}  // namespace topiary::kernels
