// Launch helpers shared by the .cu files: grid sizing for elementwise kernels, element
// loads and stores for both activation types, and dispatch on the element type.
#ifndef TOPIARY_KERNELS_RUNTIME_CUDA_LAUNCH_CUH_
#define TOPIARY_KERNELS_RUNTIME_CUDA_LAUNCH_CUH_

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the GPU several times over,
// never more than needed.
inline int BlocksFor(int64_t n, int sm_count) {
  const int64_t needed = (n + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(std::max(sm_count, 1)) * 8;
  return static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
}

// Blocks of `kernel` with `threads` threads and `smem` bytes of dynamic shared memory that one
// multiprocessor holds at once; at least 1 (a failed query leaves the launch to report).
inline int ResidentBlocksOf(const void* kernel, int threads, size_t smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();  // not sticky; a launch with a bad configuration reports it
    n = 1;
  }
  return std::max(n, 1);
}

// Blocks of `threads` threads that one multiprocessor holds at once for `Kernel` (its registers
// and shared memory decide), asked of the runtime once per kernel (a process's GPUs are one
// model): a kernel must always be launched with the same block size through these helpers.
template <auto Kernel>
int ResidentBlocks(int threads) {
  static std::atomic<int> resident{0};  // 0: not asked yet
  int n = resident.load(std::memory_order_relaxed);
  if (n == 0) {
    n = ResidentBlocksOf(reinterpret_cast<const void*>(Kernel), threads, 0);
    resident.store(n, std::memory_order_relaxed);
  }
  return n;
}

// Blocks of kThreads for a grid-stride loop of `Kernel` over n elements: those resident at once
// (one full wave; BlocksFor's fixed cap of 8 per multiprocessor leaves a last, partial wave
// whenever fewer fit, with most multiprocessors idle while it runs), never more than needed.
template <auto Kernel>
int WaveBlocksFor(int64_t n, int sm_count) {
  const int64_t needed = (n + kThreads - 1) / kThreads;
  const int64_t wave =
      static_cast<int64_t>(std::max(sm_count, 1)) * ResidentBlocks<Kernel>(kThreads);
  return static_cast<int>(std::max<int64_t>(1, std::min(needed, wave)));
}

// A reduction's row slices (a block of `threads` each) rounded down to whole waves of resident
// blocks, for the same reason; fewer slices than one wave stay as they are.
template <auto Kernel>
int WholeWaves(int slices, int threads, int sm_count) {
  const int wave = std::max(sm_count, 1) * ResidentBlocks<Kernel>(threads);
  return slices > wave ? slices / wave * wave : slices;
}

// A kernel as a type, for generic code that needs it as a template argument (ResidentBlocks).
template <auto Kernel>
struct KernelTag {
  static constexpr auto kKernel = Kernel;
};

#define TOPIARY_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Loads and stores of activation elements: fp32 arithmetic whatever the storage type.
__device__ __forceinline__ float Ld(const float* p) { return *p; }
__device__ __forceinline__ float Ld(const Bf16* p) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}
__device__ __forceinline__ void St(float* p, float v) { *p = v; }
__device__ __forceinline__ void St(Bf16* p, float v) {
  *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);
}

// 16-byte vectors of activation elements (4 floats or 8 bf16): memory-bound kernels move
// whole vectors per thread, which a 2-byte element per thread cannot do at full bandwidth.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ void LdVec(const T* p, float (&v)[kVec<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) v[k] = Ld(e + k);
}

template <typename T>
__device__ __forceinline__ void StVec(T* p, const float (&v)[kVec<T>]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) St(e + k, v[k]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// Lets `Kernel` launch with `bytes` of dynamic shared memory on the current device. The
// attribute is set once per kernel, device and larger size, not on every launch (it is a
// driver call; under stream capture it runs only at capture anyway).
template <auto Kernel>
cudaError_t AllowDynamicSmem(int bytes) {
  constexpr int kDevices = 64;
  static std::atomic<int> allowed[kDevices];  // zero-initialized: static storage
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaGetLastError();
  const bool tracked = device >= 0 && device < kDevices;
  if (tracked && allowed[device].load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && tracked) {
    int seen = allowed[device].load(std::memory_order_relaxed);
    while (seen < bytes && !allowed[device].compare_exchange_weak(seen, bytes)) {
    }
  }
  return e;
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Calls fn(T{}) with T the storage type of `dtype` (float or Bf16): one templated kernel
// serves both element types behind a type-erased entry point.
// Returns what fn returns (nothing, or a Status).
template <typename Fn>
inline auto VisitDType(DType dtype, Fn&& fn) {
  if (dtype == DType::kBf16) return fn(Bf16{});
  return fn(float{});
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_CUDA_LAUNCH_CUH_
