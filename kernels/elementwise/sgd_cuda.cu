#include "kernels/elementwise/sgd.h"
#include "kernels/elementwise/sgd_impl.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {
namespace {

// Tensors per launch: keeps the kernel's parameters within the classic 4 KB limit.
constexpr int kBatch = 64;

struct SgdBatch {
  SgdTensor t[kBatch];
};

// blockIdx.y picks the tensor; the x blocks stride over it.
__global__ void SgdKernel(SgdParams p, const float* lr_ptr, SgdBatch batch) {
  const SgdTensor& t = batch.t[blockIdx.y];
  const float lr = *lr_ptr;
  SgdParams q = p;
  q.weight_decay = t.decay ? p.weight_decay : 0.0f;
  TOPIARY_GRID_STRIDE(i, t.n) {
    SgdUpdate(q, lr, t.grad[i], t.mask != nullptr && t.mask[i] == 0, t.w[i], t.momentum_buf[i]);
  }
}

}  // namespace

absl::Status SgdStepCuda(const SgdParams& p, const float* lr, const std::vector<SgdTensor>& tensors,
                         const CudaContext& ctx) {
  for (size_t first = 0; first < tensors.size(); first += kBatch) {
    const int count = static_cast<int>(std::min<size_t>(kBatch, tensors.size() - first));
    SgdBatch batch;
    int64_t largest = 0;
    for (int i = 0; i < count; ++i) {
      batch.t[i] = tensors[first + i];
      largest = std::max(largest, batch.t[i].n);
    }
    const dim3 grid(BlocksFor(largest, ctx.sm_count), count);
    SgdKernel<<<grid, kThreads, 0, ctx.stream>>>(p, lr, batch);
    TOPIARY_RETURN_IF_ERROR(LaunchStatus("sgd step"));
  }
  return absl::OkStatus();
}

}  // namespace topiary::kernels
