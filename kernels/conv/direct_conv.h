// Direct fp32 convolutions for small channel counts on the GPU (issue 43: resnet20's layers,
// C and K of 16-64 at 8x8-32x32 pixels). cuDNN runs these shapes at a small fraction of the
// GPU's FMA rate whatever the math mode; a tiled direct kernel keeps each block's input window
// and filter chunk in shared memory and gives every thread a 4-pixel x 8-channel register tile
// (fp32 FMAs), or every warp 32 pixels x the block's output channels on tensor cores (TF32,
// and bf16 for bf16 activations). ConvCudaPlan times them beside cuDNN's algorithms and keeps
// whichever is faster, pass by pass: the fp32 kernels in fp32 plans, the TF32 ones in TF32
// plans (a backward filter that is neither 3x3 nor 1x1 stays fp32, which TF32 allows), the
// bf16 ones in bf16 plans.
#ifndef TOPIARY_KERNELS_CONV_DIRECT_CONV_H_
#define TOPIARY_KERNELS_CONV_DIRECT_CONV_H_

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

struct CudaContext;

// Whether the direct kernels take this shape for the pass (0 forward, 1 backward data,
// 2 backward filter): NHWC, the reduced channels a multiple of 16 and the produced ones
// a multiple of 8, both at most 128; backward data only at stride 1 with pad < R and S.
bool DirectConvSupported(const ConvShape& shape, int pass);

// Bytes of workspace a pass needs (backward data: the filter transposed and flipped;
// backward filter: per-block partial sums).
size_t DirectConvWorkspaceBytes(const ConvShape& shape, int pass, int sm_count);

// As Conv2dForwardCpu without the bias. With tf32 the products are of operands rounded to
// TF32 (to nearest) on tensor cores (mma.sync), accumulated in fp32, as cuDNN's TF32;
// without, plain fp32 FMAs. REQUIRES: DirectConvSupported(shape, 0).
absl::Status DirectConvForwardCuda(const ConvShape& shape, const float* x, const float* w, float* y,
                                   bool tf32, const CudaContext& ctx);

// As Conv2dBackwardDataCpu (tf32 as above). REQUIRES: DirectConvSupported(shape, 1);
// workspace holds DirectConvWorkspaceBytes(shape, 1, ...) bytes.
absl::Status DirectConvBackwardDataCuda(const ConvShape& shape, const float* dy, const float* w,
                                        float* dx, void* workspace, bool tf32,
                                        const CudaContext& ctx);

// As Conv2dBackwardFilterCpu without the bias: each block sums a fixed range of pixels, and
// the blocks' partial sums are added in a fixed order, so the result is the same bits on
// every run. With tf32, 3x3 and 1x1 filters run on tensor cores (operands rounded to TF32,
// fp32 sums; other filters keep fp32 FMAs). REQUIRES: DirectConvSupported(shape, 2);
// workspace as above.
absl::Status DirectConvBackwardFilterCuda(const ConvShape& shape, const float* x, const float* dy,
                                          float* dw, void* workspace, bool tf32,
                                          const CudaContext& ctx);

// The bf16 forms, for the shapes DirectConvBf16Supported takes (DirectConvSupported's, and
// for backward filter 3x3 or 1x1 filters): mma.sync m16n8k16 on the bf16 operands, fp32 sums,
// each output rounded to bf16 once (as cuDNN's bf16 convolutions). Workspace as the fp32
// kernels': DirectConvWorkspaceBytes(shape, pass, ...) bytes (backward data: the filter
// transposed and flipped, half of it used; backward filter: the blocks' fp32 partial filters,
// added in a fixed order).
bool DirectConvBf16Supported(const ConvShape& shape, int pass);
absl::Status DirectConvForwardBf16Cuda(const ConvShape& shape, const Bf16* x, const Bf16* w,
                                       Bf16* y, const CudaContext& ctx);
absl::Status DirectConvBackwardDataBf16Cuda(const ConvShape& shape, const Bf16* dy, const Bf16* w,
                                            Bf16* dx, void* workspace, const CudaContext& ctx);
absl::Status DirectConvBackwardFilterBf16Cuda(const ConvShape& shape, const Bf16* x, const Bf16* dy,
                                              Bf16* dw, void* workspace, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_DIRECT_CONV_H_
