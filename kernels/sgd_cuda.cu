#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/sgd.h"

namespace topiary::kernels {
namespace {

// The same arithmetic, in the same order, as SgdStepCpu.
__global__ void SgdKernel(int64_t n, SgdParams p, const float* lr_ptr, const float* grad,
                          const uint8_t* mask, float* w, float* buf) {
  const float lr = *lr_ptr;
  const float l2 = p.decoupled ? 0.0f : p.weight_decay;
  const float shrink = p.decoupled ? 1.0f - lr * p.weight_decay : 1.0f;
  TOPIARY_GRID_STRIDE(i, n) {
    if (mask != nullptr && mask[i] == 0) {
      w[i] = 0.0f;
      buf[i] = 0.0f;
      continue;
    }
    const float g = grad[i] + l2 * w[i];
    const float b = p.momentum * buf[i] + g;
    buf[i] = b;
    const float d = p.nesterov ? g + p.momentum * b : b;
    w[i] = w[i] * shrink - lr * d;
  }
}

}  // namespace

absl::Status SgdStepCuda(int64_t n, const SgdParams& p, const float* lr, const float* grad,
                         const uint8_t* mask, float* w, float* momentum_buf,
                         const CudaContext& ctx) {
  SgdKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, p, lr, grad, mask, w,
                                                                     momentum_buf);
  return LaunchStatus("sgd step");
}

}  // namespace topiary::kernels
