// 2-D convolution (groups = 1) on NHWC activations with KRSC filters.
//
// CPU: im2col reduction to GEMM (Caffe's method), processed in chunks of images so the
// column buffer stays small; 1x1 stride-1 unpadded convolutions skip im2col entirely.
// Filters are [K, R, S, C] in memory, so a filter row is one im2col row and both the
// forward and the backward passes are single GEMMs per chunk.
#ifndef TOPIARY_KERNELS_CONV_H_
#define TOPIARY_KERNELS_CONV_H_

#include <cstddef>

#include "absl/status/status.h"

namespace topiary::kernels {

struct ConvShape {
  int n = 0, h = 0, w = 0, c = 0;  // input  [N, H, W, C]
  int k = 0, r = 0, s = 0;         // filter [K, R, S, C]
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;

  int ho() const { return (h + 2 * pad_h - r) / stride_h + 1; }
  int wo() const { return (w + 2 * pad_w - s) / stride_w + 1; }
  // Length of one im2col row (one output pixel's receptive field).
  int patch() const { return r * s * c; }
  bool is_pointwise() const {
    return r == 1 && s == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 && pad_w == 0;
  }
};

// OK when every size is positive and the output is at least 1x1; otherwise names the problem.
absl::Status CheckConvShape(const ConvShape& shape);

// Floats of scratch memory the CPU kernels below need (0 for pointwise convolutions).
size_t ConvWorkspaceFloatsCpu(const ConvShape& shape);

// y[N, Ho, Wo, K] = conv(x, w) (+ bias[K] when bias != nullptr).
// REQUIRES: CheckConvShape(shape).ok(); workspace holds ConvWorkspaceFloatsCpu(shape) floats.
void Conv2dForwardCpu(const ConvShape& shape, const float* x, const float* w, const float* bias,
                      float* y, float* workspace);

// dx[N, H, W, C] = gradient of the loss w.r.t. x given dy[N, Ho, Wo, K] (overwrites dx).
void Conv2dBackwardDataCpu(const ConvShape& shape, const float* dy, const float* w, float* dx,
                           float* workspace);

// dw[K, R, S, C] (and dbias[K] when not null) = gradients w.r.t. the filter (overwrites).
void Conv2dBackwardFilterCpu(const ConvShape& shape, const float* x, const float* dy, float* dw,
                             float* dbias, float* workspace);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_H_
