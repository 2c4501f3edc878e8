// SGD with momentum, Nesterov and weight decay, fused with mask projection.
#ifndef TOPIARY_KERNELS_SGD_H_
#define TOPIARY_KERNELS_SGD_H_

#include <cstdint>

#include "absl/status/status.h"

namespace topiary::kernels {

struct CudaContext;

struct SgdParams {
  float lr = 0.1f;
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  bool decoupled = false;  // SGDW: w -= lr*wd*w instead of adding wd*w to the gradient
};

// One step over n values, PyTorch semantics (dampening 0):
//   g' = g (+ wd*w if L2);  buf = momentum*buf + g';  d = nesterov ? g' + momentum*buf : buf
//   w -= lr*d  (and w -= lr*wd*w_old if decoupled)
// With a mask (uint8 0/1, may be null): gradients of masked entries are ignored, and after the
// update w and buf are exactly zero there, so pruned weights cannot drift back.
void SgdStepCpu(int64_t n, const SgdParams& p, const float* grad, const uint8_t* mask, float* w,
                float* momentum_buf);

// CUDA twin. The learning rate is read from device memory (*lr, replacing p.lr) so that a
// captured CUDA graph picks up each step's rate without being rebuilt.
absl::Status SgdStepCuda(int64_t n, const SgdParams& p, const float* lr, const float* grad,
                         const uint8_t* mask, float* w, float* momentum_buf,
                         const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SGD_H_
