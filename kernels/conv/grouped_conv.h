// Grouped 2-D convolution (groups > 1; depthwise when every group has one input channel) on
// NHWC activations with filters [K, R, S, C / groups]: output channel k reads the input
// channels of its group, g = k / (K / groups). Direct loops, no im2col and no library:
// the layers that use it (MobileNet's depthwise 3x3s, ResNeXt's grouped 3x3s) do little
// arithmetic per byte, and neither cuDNN's nor the block-sparse engines' extensions
// (approximate, sampled, block-pruned convolutions) apply to them.
#ifndef TOPIARY_KERNELS_CONV_GROUPED_CONV_H_
#define TOPIARY_KERNELS_CONV_GROUPED_CONV_H_

#include "absl/status/status.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

struct CudaContext;

// shape.c is every input channel, shape.k every output channel; both divisible by groups.
struct GroupedConvShape {
  ConvShape conv;
  int groups = 1;
  TOPIARY_HD int cg() const { return conv.c / groups; }  // input channels per group
  TOPIARY_HD int kg() const { return conv.k / groups; }  // output channels per group

  // The input pixel that output pixel (p, q) reads through filter tap (r, t): false when it
  // falls in the padding. Every kernel below (CPU and CUDA) walks its taps through this.
  TOPIARY_HD bool Tap(int p, int q, int r, int t, int* h, int* col) const {
    *h = p * conv.stride_h - conv.pad_h + r;
    *col = q * conv.stride_w - conv.pad_w + t;
    return *h >= 0 && *h < conv.h && *col >= 0 && *col < conv.w;
  }
  // Element offsets: input (n, h, col, channel c), output (n, p, q, k), filter (k, r, t, ci).
  TOPIARY_HD int64_t In(int64_t n, int h, int col, int c) const {
    return ((n * conv.h + h) * conv.w + col) * conv.c + c;
  }
  TOPIARY_HD int64_t Out(int64_t n, int p, int q, int k) const {
    return ((n * conv.ho() + p) * conv.wo() + q) * conv.k + k;
  }
  TOPIARY_HD int64_t Filter(int k, int r, int t, int ci) const {
    return ((static_cast<int64_t>(k) * conv.r + r) * conv.s + t) * cg() + ci;
  }
};

// OK when the convolution's shape is valid and both channel counts divide by groups.
absl::Status CheckGroupedConvShape(const GroupedConvShape& shape);

// y[N, Ho, Wo, K] = conv(x, w) (+ bias[K] when not null).
void GroupedConvForwardCpu(const GroupedConvShape& shape, const float* x, const float* w,
                           const float* bias, float* y);
// dx[N, H, W, C] from dy[N, Ho, Wo, K] (overwrites).
void GroupedConvBackwardDataCpu(const GroupedConvShape& shape, const float* dy, const float* w,
                                float* dx);
// dw[K, R, S, C / groups] (overwrites; dbias, when not null, too).
void GroupedConvBackwardFilterCpu(const GroupedConvShape& shape, const float* x, const float* dy,
                                  float* dw, float* dbias);

// CUDA twins: activations of type t, filters, bias and their gradients fp32 (also in a bf16
// network: the layer has no bf16 weight copy), fp32 arithmetic. The filter gradient sums
// every pixel of the batch per weight in a fixed order (deterministic).
absl::Status GroupedConvForwardCuda(DType t, const GroupedConvShape& shape, const void* x,
                                    const float* w, const float* bias, void* y,
                                    const CudaContext& ctx);
absl::Status GroupedConvBackwardDataCuda(DType t, const GroupedConvShape& shape, const void* dy,
                                         const float* w, void* dx, const CudaContext& ctx);
absl::Status GroupedConvBackwardFilterCuda(DType t, const GroupedConvShape& shape, const void* x,
                                           const void* dy, float* dw, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_GROUPED_CONV_H_
