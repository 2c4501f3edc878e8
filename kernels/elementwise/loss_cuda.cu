#include <cfloat>

#include "kernels/elementwise/loss.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kSamplesPerBlock = 4;  // one warp per sample

__device__ inline float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ inline float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline int WarpSumInt(int v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void LossKernel(int n, int classes, const T* __restrict__ logits,
                           const int32_t* __restrict__ labels, float smoothing,
                           T* __restrict__ dlogits, float* __restrict__ sample_loss,
                           int32_t* __restrict__ rank) {
  const int lane = threadIdx.x % kWarp;
  const int i = blockIdx.x * kSamplesPerBlock + threadIdx.x / kWarp;
  if (i >= n) return;  // whole warps exit together
  const T* z = logits + static_cast<int64_t>(i) * classes;
  const int y = labels[i];
  const float zy = Ld(z + y);
  float zmax = -FLT_MAX, zsum = 0.0f;
  int above = 0;
  for (int j = lane; j < classes; j += kWarp) {
    const float zj = Ld(z + j);
    zmax = fmaxf(zmax, zj);
    zsum += zj;
    above += (zj > zy || (zj == zy && j < y)) ? 1 : 0;
  }
  zmax = WarpMax(zmax);
  zsum = WarpSum(zsum);
  above = WarpSumInt(above);
  float esum = 0.0f;
  for (int j = lane; j < classes; j += kWarp) esum += expf(Ld(z + j) - zmax);
  esum = WarpSum(esum);
  const float log_z = zmax + logf(esum);
  const float off = smoothing / classes;
  const float on = 1.0f - smoothing + off;
  if (dlogits != nullptr) {
    T* d = dlogits + static_cast<int64_t>(i) * classes;
    for (int j = lane; j < classes; j += kWarp) {
      const float p = expf(Ld(z + j) - log_z);
      St(d + j, (p - (j == y ? on : off)) / n);
    }
  }
  if (lane == 0) {
    sample_loss[i] = log_z - off * zsum - (on - off) * zy;
    rank[i] = above;
  }
}

__global__ void AccumulateKernel(int count, const float* sample_loss, const int32_t* rank, int k,
                                 double* acc) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double loss = 0.0;
  long long top1 = 0, topk = 0;
  for (int i = 0; i < count; ++i) {
    loss += sample_loss[i];
    top1 += rank[i] < 1;
    topk += rank[i] < k;
  }
  acc[0] += loss;
  acc[1] += static_cast<double>(top1);
  acc[2] += static_cast<double>(topk);
  acc[3] += count;
}

}  // namespace

absl::Status SoftmaxCrossEntropyCuda(DType t, int n, int classes, const void* logits,
                                     const int32_t* labels, float smoothing, void* dlogits,
                                     float* sample_loss, int32_t* rank, const CudaContext& ctx) {
  const int blocks = (n + kSamplesPerBlock - 1) / kSamplesPerBlock;
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    LossKernel<<<blocks, kSamplesPerBlock * kWarp, 0, ctx.stream>>>(
        n, classes, static_cast<const T*>(logits), labels, smoothing, static_cast<T*>(dlogits),
        sample_loss, rank);
  });
  return LaunchStatus("softmax cross-entropy");
}

absl::Status AccumulateMetricsCuda(int count, const float* sample_loss, const int32_t* rank, int k,
                                   double* acc, const CudaContext& ctx) {
  AccumulateKernel<<<1, 32, 0, ctx.stream>>>(count, sample_loss, rank, k, acc);
  return LaunchStatus("accumulate metrics");
}

}  // namespace topiary::kernels
