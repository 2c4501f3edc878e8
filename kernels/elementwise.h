// Elementwise operations: ReLU and the residual add (and its use as a gradient sum).
#ifndef TOPIARY_KERNELS_ELEMENTWISE_H_
#define TOPIARY_KERNELS_ELEMENTWISE_H_

#include <cstdint>

namespace topiary::kernels {

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

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_ELEMENTWISE_H_
