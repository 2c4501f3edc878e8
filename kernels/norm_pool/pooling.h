// Pooling over NHWC activations: max and average windows, and global average pooling.
#ifndef TOPIARY_KERNELS_NORM_POOL_POOLING_H_
#define TOPIARY_KERNELS_NORM_POOL_POOLING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/runtime/dtype.h"
#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

struct CudaContext;

struct PoolShape {
  int n = 0, h = 0, w = 0, c = 0;  // input [N, H, W, C]
  int r = 2, s = 2;                // window
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;

  TOPIARY_HD int ho() const { return (h + 2 * pad_h - r) / stride_h + 1; }
  TOPIARY_HD int wo() const { return (w + 2 * pad_w - s) / stride_w + 1; }
};

// OK when sizes are positive, padding is at most half the window (PyTorch's rule, so every
// window holds a real pixel), the window has at most 255 positions and the output is at least
// 1x1.
absl::Status CheckPoolShape(const PoolShape& shape);

// Max pooling; padded positions never win. Backward routes each output gradient to the first
// input position (in scan order) holding the window's maximum, and overwrites dx.
void MaxPoolForwardCpu(const PoolShape& shape, const float* x, float* y);
void MaxPoolBackwardCpu(const PoolShape& shape, const float* x, const float* y, const float* dy,
                        float* dx);

// Average pooling; padded positions count as zeros (PyTorch's count_include_pad = true).
void AvgPoolForwardCpu(const PoolShape& shape, const float* x, float* y);
void AvgPoolBackwardCpu(const PoolShape& shape, const float* dy, float* dx);

// Global average pooling: [N, HW, C] -> [N, C], and back (dx overwritten).
void GlobalAvgPoolForwardCpu(int n, int hw, int c, const float* x, float* y);
void GlobalAvgPoolBackwardCpu(int n, int hw, int c, const float* dy, float* dx);

// CUDA twins, on activations of type t (fp32 or bf16). The backward passes gather (each
// input pixel sums the windows that route to it), so they need no atomics and match the CPU's
// first-maximum tie rule.
// Max pooling on the GPU records each maximum's position in its window in argmax (one byte
// per output, same layout as y; null in inference), and the backward pass reads it.
absl::Status MaxPoolForwardCuda(DType t, const PoolShape& shape, const void* x, void* y,
                                uint8_t* argmax, const CudaContext& ctx);
absl::Status MaxPoolBackwardCuda(DType t, const PoolShape& shape, const uint8_t* argmax,
                                 const void* dy, void* dx, const CudaContext& ctx);
absl::Status AvgPoolForwardCuda(DType t, const PoolShape& shape, const void* x, void* y,
                                const CudaContext& ctx);
absl::Status AvgPoolBackwardCuda(DType t, const PoolShape& shape, const void* dy, void* dx,
                                 const CudaContext& ctx);
absl::Status GlobalAvgPoolForwardCuda(DType t, int n, int hw, int c, const void* x, void* y,
                                      const CudaContext& ctx);
absl::Status GlobalAvgPoolBackwardCuda(DType t, int n, int hw, int c, const void* dy, void* dx,
                                       const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_NORM_POOL_POOLING_H_
