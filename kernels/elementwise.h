// Elementwise operations: ReLU and the residual add (and its use as a gradient sum).
#ifndef TOPIARY_KERNELS_ELEMENTWISE_H_
#define TOPIARY_KERNELS_ELEMENTWISE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace topiary::kernels {

struct CudaContext;

// y = max(x, 0). x and y may alias.
void ReluForwardCpu(int64_t n, const float* x, float* y);
// dx = dy where y > 0, else 0 (uses the output, so the input need not be kept). May alias.
void ReluBackwardCpu(int64_t n, const float* y, const float* dy, float* dx);
// y = a + b. Any of them may alias.
void AddCpu(int64_t n, const float* a, const float* b, float* y);
// Residual add fused with the ReLU after it: y = max(a + b, 0).
void AddReluCpu(int64_t n, const float* a, const float* b, float* y);
// Its backward: da = db = dy where y > 0, else 0 (one pass writing both).
void AddReluBackwardCpu(int64_t n, const float* y, const float* dy, float* da, float* db);

// CUDA twins (device pointers; enqueued on ctx.stream).
absl::Status CopyCuda(int64_t n, const float* src, float* dst, const CudaContext& ctx);
absl::Status ReluForwardCuda(int64_t n, const float* x, float* y, const CudaContext& ctx);
absl::Status ReluBackwardCuda(int64_t n, const float* y, const float* dy, float* dx,
                              const CudaContext& ctx);
absl::Status AddCuda(int64_t n, const float* a, const float* b, float* y, const CudaContext& ctx);
absl::Status AddReluCuda(int64_t n, const float* a, const float* b, float* y,
                         const CudaContext& ctx);
absl::Status AddReluBackwardCuda(int64_t n, const float* y, const float* dy, float* da, float* db,
                                 const CudaContext& ctx);

// Per-channel bias on rows of [rows, c]: y[i, j] += bias[j]; and its gradient, the column
// sums db[j] = sum_i dy[i, j] (overwritten). Used by convolutions and linear layers.
void AddBiasCpu(int64_t rows, int c, const float* bias, float* y);
void BiasGradCpu(int64_t rows, int c, const float* dy, float* db);
absl::Status AddBiasCuda(int64_t rows, int c, const float* bias, float* y, const CudaContext& ctx);
absl::Status BiasGradCuda(int64_t rows, int c, const float* dy, float* db, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_ELEMENTWISE_H_
