// Launch helpers shared by the .cu files: grid sizing for elementwise kernels.
#ifndef TOPIARY_KERNELS_CUDA_LAUNCH_CUH_
#define TOPIARY_KERNELS_CUDA_LAUNCH_CUH_

#include <algorithm>
#include <cstdint>

namespace topiary::kernels {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the GPU several times over,
// never more than needed.
inline int BlocksFor(int64_t n, int sm_count) {
  const int64_t needed = (n + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(std::max(sm_count, 1)) * 8;
  return static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
}

#define TOPIARY_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CUDA_LAUNCH_CUH_
