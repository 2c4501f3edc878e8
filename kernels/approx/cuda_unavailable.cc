// The CUDA entry points of kernels/approx in a CPU-only build (see kernels/runtime/no_cuda.h).
#include "kernels/approx/approx_conv.h"
#include "kernels/runtime/no_cuda.h"

namespace topiary::kernels {

size_t ApproxConvWorkspaceBytes(const ConvShape&) { return 0; }
absl::Status ApproxConvPrepareCuda() { return NoCuda(); }
absl::Status ApproxConv2dForwardCuda(const ConvShape&, const float*, const float*, const float*,
                                     const uint16_t*, float*, float*, float*, QuantParams*, void*,
                                     const CudaContext&, const ApproxConvOptions&) {
  return NoCuda();
}

}  // namespace topiary::kernels
