// The per-element SGD update shared by sgd_cpu.cc and sgd_cuda.cu: the same arithmetic, in
// the same order, on both devices.
#ifndef TOPIARY_KERNELS_ELEMENTWISE_SGD_IMPL_H_
#define TOPIARY_KERNELS_ELEMENTWISE_SGD_IMPL_H_

#include "kernels/elementwise/sgd.h"
#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

// One element: updates w and buf in place. lr is passed separately (the GPU reads it from
// device memory).
TOPIARY_HD inline void SgdUpdate(const SgdParams& p, float lr, float grad, bool masked, float& w,
                                 float& buf) {
  if (masked) {
    w = 0.0f;
    buf = 0.0f;
    return;
  }
  const float l2 = p.decoupled ? 0.0f : p.weight_decay;
  const float shrink = p.decoupled ? 1.0f - lr * p.weight_decay : 1.0f;
  const float g = grad + l2 * w;
  buf = p.momentum * buf + g;
  const float d = p.nesterov ? g + p.momentum * buf : buf;
  w = w * shrink - lr * d;
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_ELEMENTWISE_SGD_IMPL_H_
