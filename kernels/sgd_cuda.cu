#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/sgd.h"
#include "kernels/sgd_impl.h"

namespace topiary::kernels {
namespace {

__global__ void SgdKernel(int64_t n, SgdParams p, const float* lr_ptr, const float* grad,
                          const uint8_t* mask, float* w, float* buf) {
  const float lr = *lr_ptr;
  TOPIARY_GRID_STRIDE(i, n) {
    SgdUpdate(p, lr, grad[i], mask != nullptr && mask[i] == 0, w[i], buf[i]);
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
