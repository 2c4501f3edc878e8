#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/elementwise.h"

namespace topiary::kernels {
namespace {

__global__ void ReluForwardKernel(int64_t n, const float* __restrict__ x, float* __restrict__ y) {
  TOPIARY_GRID_STRIDE(i, n) { y[i] = fmaxf(x[i], 0.0f); }
}

__global__ void ReluBackwardKernel(int64_t n, const float* y, const float* dy, float* dx) {
  TOPIARY_GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

__global__ void AddKernel(int64_t n, const float* a, const float* b, float* y) {
  TOPIARY_GRID_STRIDE(i, n) { y[i] = a[i] + b[i]; }
}

__global__ void AddReluKernel(int64_t n, const float* a, const float* b, float* y) {
  TOPIARY_GRID_STRIDE(i, n) { y[i] = fmaxf(a[i] + b[i], 0.0f); }
}

__global__ void AddReluBackwardKernel(int64_t n, const float* y, const float* dy, float* da,
                                      float* db) {
  TOPIARY_GRID_STRIDE(i, n) {
    const float g = y[i] > 0.0f ? dy[i] : 0.0f;
    da[i] = g;
    db[i] = g;
  }
}

__global__ void AddBiasKernel(int64_t n, int c, const float* bias, float* y) {
  TOPIARY_GRID_STRIDE(i, n) { y[i] += bias[i % c]; }
}

// One block per column: threads sum strided rows, then a fixed binary tree in shared memory
// combines them (deterministic; a convolution's bias has 10^5 rows, too many for one thread).
constexpr int kColumnThreads = 256;

__global__ void BiasGradKernel(int64_t rows, int c, const float* __restrict__ dy,
                               float* __restrict__ db) {
  const int j = blockIdx.x;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += kColumnThreads) s += dy[i * c + j];
  __shared__ float part[kColumnThreads];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kColumnThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[j] = part[0];
}

}  // namespace

absl::Status CopyCuda(int64_t n, const float* src, float* dst, const CudaContext& ctx) {
  return CudaStatus(
      cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream),
      "device copy");
}

absl::Status ReluForwardCuda(int64_t n, const float* x, float* y, const CudaContext& ctx) {
  ReluForwardKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, x, y);
  return LaunchStatus("relu forward");
}

absl::Status ReluBackwardCuda(int64_t n, const float* y, const float* dy, float* dx,
                              const CudaContext& ctx) {
  ReluBackwardKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, y, dy, dx);
  return LaunchStatus("relu backward");
}

absl::Status AddCuda(int64_t n, const float* a, const float* b, float* y, const CudaContext& ctx) {
  AddKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, a, b, y);
  return LaunchStatus("add");
}

absl::Status AddReluCuda(int64_t n, const float* a, const float* b, float* y,
                         const CudaContext& ctx) {
  AddReluKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, a, b, y);
  return LaunchStatus("add+relu");
}

absl::Status AddReluBackwardCuda(int64_t n, const float* y, const float* dy, float* da, float* db,
                                 const CudaContext& ctx) {
  AddReluBackwardKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, y, dy, da, db);
  return LaunchStatus("add+relu backward");
}

absl::Status AddBiasCuda(int64_t rows, int c, const float* bias, float* y, const CudaContext& ctx) {
  const int64_t n = rows * c;
  AddBiasKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, c, bias, y);
  return LaunchStatus("bias add");
}

absl::Status BiasGradCuda(int64_t rows, int c, const float* dy, float* db, const CudaContext& ctx) {
  BiasGradKernel<<<c, kColumnThreads, 0, ctx.stream>>>(rows, c, dy, db);
  return LaunchStatus("bias gradient");
}

}  // namespace topiary::kernels
