// The K tiles an implicit-GEMM convolution must read under a block mask, per tile of its
// output channels: the lists a Hopper block-sparse kernel's producer walks instead of every
// K tile (hopper_conv.h).
//
// Forward: M is the output pixels, N the output channels and K the (input channel, filter tap)
// pairs. Backward data: M is the input pixels, N the input channels and K the (output channel,
// tap) pairs. CUTLASS's im2col loads cut K into tiles of `tile_k` reduction channels of one
// tap, numbered t = c_tile + c_tiles * (s + S * r) (channels fastest, then the filter column,
// then the row). A tile of N needs a K tile when the grid keeps any block that covers both:
// every other K tile multiplies zeros only. Any grid works; tiles that match the blocks
// (tile_k dividing the reduction side's block, tile_n the other) skip exactly the pruned
// blocks.
#ifndef TOPIARY_KERNELS_SPARSE_KEPT_TILES_H_
#define TOPIARY_KERNELS_SPARSE_KEPT_TILES_H_

#include <cstdint>
#include <vector>

#include "kernels/conv/conv.h"
#include "kernels/sparse/block_grid.h"
#include "kernels/sparse/block_sparse_conv.h"

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

// For the forward or backward-data pass.
// REQUIRES: CheckBlockGrid(shape, grid).ok(), tile_k > 0, tile_n > 0, pass not backward filter.
KeptTiles MakeKeptTiles(SparsePass pass, const ConvShape& shape, const BlockGrid& grid, int tile_k,
                        int tile_n);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_KEPT_TILES_H_
