// The last step of a reduction split over blocks (the direct and stem kernels' backward
// filters): the blocks' partial results added in a fixed order.
#ifndef TOPIARY_KERNELS_CONV_SPLIT_SUMS_CUH_
#define TOPIARY_KERNELS_CONV_SPLIT_SUMS_CUH_

#include <cstdint>

#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {

// out[e] = the sum over parts p of part[p * count + e] (the per-block partial results of a
// reduction split over blocks), in a fixed order: the same bits on every run. A block adds 32
// consecutive elements (coalesced reads) over 32 lanes of parts, each lane every 32nd part,
// then the lanes in order: 32 loads in flight per element where one thread per element would
// wait out `parts` dependent loads (most of a small layer's backward filter). Launch
// SumPartsBlocks(count) blocks of kSumPartsThreads.
inline const dim3 kSumPartsThreads(32, 32);
inline unsigned SumPartsBlocks(int64_t count) { return static_cast<unsigned>((count + 31) / 32); }

template <typename T>
__global__ void __launch_bounds__(1024)
    SumPartsKernel(int parts, int64_t count, const float* __restrict__ part, T* __restrict__ out) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (e < count) {
#pragma unroll 4
    for (int p = threadIdx.y; p < parts; p += 32) s += part[p * count + e];
  }
  __shared__ float lanes[32][33];
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || e >= count) return;
  float total = 0.0f;
  for (int l = 0; l < 32; ++l) total += lanes[l][threadIdx.x];
  St(out + e, total);
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_SPLIT_SUMS_CUH_
