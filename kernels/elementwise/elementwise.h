// Elementwise operations: ReLU and the residual add (and its use as a gradient sum).
#ifndef TOPIARY_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
#define TOPIARY_KERNELS_ELEMENTWISE_ELEMENTWISE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

struct CudaContext;

// y = max(x, 0). x and y may alias.
void ReluForwardCpu(int64_t n, const float* x, float* y);
// dx = dy where y > 0, else 0 (uses the output, so the input need not be kept). May alias.
void ReluBackwardCpu(int64_t n, const float* y, const float* dy, float* dx);
// ReLU6 (MobileNet's clipped ReLU): y = min(max(x, 0), 6); its backward passes dy where
// 0 < y < 6 (PyTorch's hardtanh: the gradient is 0 at and beyond either bound). May alias.
void Relu6ForwardCpu(int64_t n, const float* x, float* y);
void Relu6BackwardCpu(int64_t n, const float* y, const float* dy, float* dx);
// Channel concatenation of NHWC tensors, one input at a time: wide[i, offset + j] =
// narrow[i, j] for rows i < rows and j < width (narrow rows are `width` wide, wide rows
// `wide_width`). SplitChannels is its backward: the slice of the wide gradient back out.
void ConcatChannelsCpu(int64_t rows, int width, int wide_width, int offset, const float* narrow,
                       float* wide);
void SplitChannelsCpu(int64_t rows, int width, int wide_width, int offset, const float* wide,
                      float* narrow);
// y = a + b. Any of them may alias.
void AddCpu(int64_t n, const float* a, const float* b, float* y);
// Residual add fused with the ReLU after it: y = max(a + b, 0).
void AddReluCpu(int64_t n, const float* a, const float* b, float* y);
// Its backward: da = db = dy where y > 0, else 0 (one pass writing both).
void AddReluBackwardCpu(int64_t n, const float* y, const float* dy, float* da, float* db);
// The same with a second output gradient (the other reader of y, when y feeds two layers):
// da = db = dy + dy2 where y > 0, else 0. The sum is not stored: one pass instead of two.
void AddReluBackwardSumCpu(int64_t n, const float* y, const float* dy, const float* dy2, float* da,
                           float* db);

// CUDA twins (device pointers; enqueued on ctx.stream). Activations are of type `t` (fp32
// or bf16, see kernels/runtime/dtype.h) behind void pointers; arithmetic is fp32.
absl::Status CopyCuda(int64_t bytes, const void* src, void* dst, const CudaContext& ctx);
absl::Status ReluForwardCuda(DType t, int64_t n, const void* x, void* y, const CudaContext& ctx);
absl::Status ReluBackwardCuda(DType t, int64_t n, const void* y, const void* dy, void* dx,
                              const CudaContext& ctx);
absl::Status Relu6ForwardCuda(DType t, int64_t n, const void* x, void* y, const CudaContext& ctx);
absl::Status Relu6BackwardCuda(DType t, int64_t n, const void* y, const void* dy, void* dx,
                               const CudaContext& ctx);
absl::Status ConcatChannelsCuda(DType t, int64_t rows, int width, int wide_width, int offset,
                                const void* narrow, void* wide, const CudaContext& ctx);
absl::Status SplitChannelsCuda(DType t, int64_t rows, int width, int wide_width, int offset,
                               const void* wide, void* narrow, const CudaContext& ctx);
absl::Status AddCuda(DType t, int64_t n, const void* a, const void* b, void* y,
                     const CudaContext& ctx);
absl::Status AddReluCuda(DType t, int64_t n, const void* a, const void* b, void* y,
                         const CudaContext& ctx);
absl::Status AddReluBackwardCuda(DType t, int64_t n, const void* y, const void* dy, void* da,
                                 void* db, const CudaContext& ctx);
absl::Status AddReluBackwardSumCuda(DType t, int64_t n, const void* y, const void* dy,
                                    const void* dy2, void* da, void* db, const CudaContext& ctx);

// Conversions between fp32 and bf16 (round to nearest even): one array, or every entry of a
// table in device memory in one launch (the weight copies of a bf16 network).
struct CastItem {
  const void* src;
  void* dst;
  int64_t n;
};
absl::Status CastCuda(DType from, DType to, int64_t n, const void* src, void* dst,
                      const CudaContext& ctx);
absl::Status CastManyCuda(DType from, DType to, const CastItem* items, int count,
                          const CudaContext& ctx);

// Per-channel bias on rows of [rows, c]: y[i, j] += bias[j]; and its gradient, the column
// sums db[j] = sum_i dy[i, j] (overwritten). Used by convolutions and linear layers.
void AddBiasCpu(int64_t rows, int c, const float* bias, float* y);

// Activation sparsity: *count += the number of exact zeros among x[0, n).
// Data parallelism's ordered mean (trainer/dist): dst[i] = (row 0 + row 1 + ... + row
// rows-1)[i] / rows, summed in row order, so every rank and every run gets the same bits.
// CPU: the rows are separate arrays of n floats; CUDA: rows * n contiguous floats.
void MeanRowsCpu(int rows, int64_t n, const float* const* src, float* dst);
absl::Status MeanRowsCuda(int rows, int64_t n, const float* src, float* dst,
                          const CudaContext& ctx);

int64_t CountZerosCpu(int64_t n, const float* x);
absl::Status CountZerosCuda(DType t, int64_t n, const void* x, unsigned long long* count,
                            const CudaContext& ctx);
void BiasGradCpu(int64_t rows, int c, const float* dy, float* db);
// CUDA: y and dy of type t; the bias and its gradient are fp32.
absl::Status AddBiasCuda(DType t, int64_t rows, int c, const float* bias, void* y,
                         const CudaContext& ctx);
absl::Status BiasGradCuda(DType t, int64_t rows, int c, const void* dy, float* db,
                          const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_ELEMENTWISE_ELEMENTWISE_H_
