// The K tiles an implicit-GEMM forward convolution must read under a block mask, per tile of
// output channels: the lists a Hopper block-sparse kernel's producer walks instead of every
// K tile (hopper_fprop.h).
//
// In the implicit GEMM of a forward convolution, M is the output pixels, N the output
// channels and K the (input channel, filter tap) pairs. CUTLASS's im2col loads cut K into
// tiles of `tile_k` channels of one tap, numbered t = c_tile + c_tiles * (s + S * r) (channels
// fastest, then the filter column, then the row). A tile of output channels needs a K tile
// when the grid keeps any block that covers both: every other K tile multiplies zeros only.
// Any grid works; tiles that match the blocks (tile_k dividing block_in, tile_n dividing
// block_out) skip exactly the pruned blocks.
#ifndef TOPIARY_KERNELS_SPARSE_KEPT_TILES_H_
#define TOPIARY_KERNELS_SPARSE_KEPT_TILES_H_

#include <cstdint>
#include <vector>

#include "kernels/conv/conv.h"
#include "kernels/sparse/block_grid.h"

namespace topiary::kernels {

struct KeptTiles {
  int tile_k = 0, tile_n = 0;
  int k_tiles = 0;  // all K tiles: ceil(C / tile_k) * R * S
  int n_tiles = 0;  // ceil(K / tile_n)
  int stride = 0;   // entries per output tile in `index`: the most any tile keeps (at least 1)
  std::vector<int32_t> count;  // [n_tiles]
  std::vector<int32_t> index;  // [n_tiles][stride]: ascending K-tile numbers, then padding
  // Kept K tiles over all output tiles / (k_tiles * n_tiles).
  double density() const;
};

// REQUIRES: CheckBlockGrid(shape, grid).ok(), tile_k > 0, tile_n > 0.
KeptTiles ForwardKeptTiles(const ConvShape& shape, const BlockGrid& grid, int tile_k, int tile_n);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_KEPT_TILES_H_
