// The CTA count of the Hopper kernels' persistent grids (hopper_conv.cu, halo_conv.cu).
#ifndef TOPIARY_KERNELS_SPARSE_PERSISTENT_CTAS_H_
#define TOPIARY_KERNELS_SPARSE_PERSISTENT_CTAS_H_

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "kernels/runtime/cuda_context.h"

namespace topiary::kernels {

// One CTA per SM, but a count coprime with the output-channel tiles, so that each CTA's tiles
// (every gridDim.x-th, channel tiles fastest) cycle through all of them. With 132 CTAs and 4
// channel tiles, CTA b would get channel tile b % 4 every time, and the CTAs of a tile with
// more kept K tiles than the others would set the pace alone. Never more CTAs than tiles.
inline int PersistentCtas(int64_t tiles, int n_tiles, const CudaContext& ctx) {
  int ctas = std::max(ctx.sm_count, 1);
  while (ctas > 1 && std::gcd(ctas, n_tiles) != 1) --ctas;
  return static_cast<int>(std::min<int64_t>(tiles, ctas));
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_PERSISTENT_CTAS_H_
