// SGD with momentum, Nesterov and weight decay, fused with mask projection.
#ifndef TOPIARY_KERNELS_ELEMENTWISE_SGD_H_
#define TOPIARY_KERNELS_ELEMENTWISE_SGD_H_

#include <cstdint>
#include <vector>

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

// One tensor of a multi-tensor step (device pointers; mask may be null).
struct SgdTensor {
  float* w;
  float* momentum_buf;
  const float* grad;
  const uint8_t* mask;
  int64_t n;
  bool decay;  // p.weight_decay applies (else 0)
};

// CUDA twin, for every tensor of a model in a few launches (the tensors travel as kernel
// parameters, so a captured CUDA graph keeps them; one launch per tensor would cost more than
// the update of a small model). The learning rate is read from device memory (*lr, replacing
// p.lr) so that a captured graph picks up each step's rate without being rebuilt.
absl::Status SgdStepCuda(const SgdParams& p, const float* lr, const std::vector<SgdTensor>& tensors,
                         const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_ELEMENTWISE_SGD_H_
