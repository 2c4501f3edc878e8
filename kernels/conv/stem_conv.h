// bf16 convolutions of images with few channels on tensor cores (issue 43: resnet50's stem, a
// 7x7 stride-2 convolution of the 3-channel image to 64 channels). cuDNN pads such an input to
// 8 channels in a pass of its own and runs the convolution on a generic Ampere kernel at a few
// percent of the tensor cores' rate: on an H200 at batch 256, 1.5 ms forward and 0.9 ms
// backward filter, plus 0.17 ms of padding each, about 7% of resnet50's training step.
//
// The forward kernel stages, per 16 output pixels of one output row, the input window they read
// (R input rows, coalesced loads, zeros outside the image) and reads the tensor cores' A
// fragments straight from it: pixel p's values of a filter row start at p * stride * C, so no
// im2col matrix is built. The backward filter kernel, whose reduction runs over pixels, stages
// the windows with each 4-byte word pairing one value of pixels p and p + 8, so that the same
// no-gather reading works with the pixels as the tensor cores' k pairs. Both multiply by
// mma.sync (bf16 operands, fp32 sums).
// Forward and backward filter only: nothing needs the image's gradient, and layers with more
// channels belong to cuDNN and the Hopper kernels. ConvCudaPlan times them beside cuDNN's
// candidates in bf16 plans, pass by pass, as it times the direct fp32 kernels (direct_conv.h).
#ifndef TOPIARY_KERNELS_CONV_STEM_CONV_H_
#define TOPIARY_KERNELS_CONV_STEM_CONV_H_

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

struct CudaContext;

// Whether the stem kernels take this shape for the pass (0 forward, 2 backward filter; never
// 1): NHWC bf16 with at most 4 input channels, output channels a multiple of 16 (blocks of 64
// channels where K allows, else of 16: resnet20's 3 -> 16 stem), at most 32
// values per filter row (S*C), at most 32 filter rows' runs of 8 values (R * ceil(S*C / 8)),
// at most 96 KB of shared memory, and tiles and image offsets that fit 32 bits.
bool StemConvSupported(const ConvShape& shape, int pass);

// Bytes of workspace a pass needs (backward filter: the blocks' partial filters in fp32).
size_t StemConvWorkspaceBytes(const ConvShape& shape, int pass, int sm_count);

// y[N, Ho, Wo, K] = conv(x, w), as Conv2dForwardCpu without the bias, each output rounded to
// bf16 once from its fp32 sum. REQUIRES: StemConvSupported(shape, 0).
absl::Status StemConvForwardCuda(const ConvShape& shape, const Bf16* x, const Bf16* w, Bf16* y,
                                 const CudaContext& ctx);

// dw[K, R, S, C] from x and dy, as Conv2dBackwardFilterCpu without the bias: each block sums a
// fixed range of output pixels in fp32 and one more kernel adds the blocks' sums in a fixed
// order (the same bits on every run) before rounding to bf16.
// REQUIRES: StemConvSupported(shape, 2); workspace holds StemConvWorkspaceBytes(shape, 2, ...).
absl::Status StemConvBackwardFilterCuda(const ConvShape& shape, const Bf16* x, const Bf16* dy,
                                        Bf16* dw, void* workspace, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_STEM_CONV_H_
