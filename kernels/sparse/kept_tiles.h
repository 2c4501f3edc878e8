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

// The order in which each output tile's list names its channel tiles (the same at every tap):
// the one its kernel's producer walks best, measured (kept_tiles.cc).
// - kAscending: ascending.
// - kRotated: ascending from output tile j's (j mod kept)-th.
// - kColoured: an edge colouring of the output tiles x channel tiles graph: on a balanced grid
//   no two output tiles name the same channel tile at the same place of their lists.
enum class KeptOrder { kAscending, kRotated, kColoured };

struct KeptTiles {
  int tile_k = 0, tile_n = 0;
  int k_tiles = 0;  // all K tiles: ceil(C / tile_k) * R * S
  int n_tiles = 0;  // ceil(K / tile_n)
  int stride = 0;   // entries per output tile in `index`: the most any tile keeps (at least 1)
  std::vector<int32_t> count;  // [n_tiles]
  // [n_tiles][stride]: K-tile numbers, then padding. Taps in ascending order, and at every tap
  // the same channel tiles (a block covers all taps) in the same order, so count is a multiple
  // of R * S and the first count / (R * S) * T entries are the list a filter of T taps would
  // have (what backward data's stride phases read, dgrad_phases.h), the channel tiles in the
  // KeptOrder asked for.
  std::vector<int32_t> index;
  // Kept K tiles over all output tiles / (k_tiles * n_tiles).
  double density() const;
};

// For the forward or backward-data pass.
// REQUIRES: CheckBlockGrid(shape, grid).ok(), tile_k > 0, tile_n > 0, pass not backward filter.
KeptTiles MakeKeptTiles(SparsePass pass, const ConvShape& shape, const BlockGrid& grid, int tile_k,
                        int tile_n, KeptOrder order = KeptOrder::kAscending);

// Backward filter: M is the output channels, N the (input channel, tap) pairs numbered like K
// above (n = c_tile + c_tiles * (s + S * r)), K the output pixels. Its output tiles are the
// filter's: tile (m, n) is kept when the grid keeps any block that covers part of it, and
// every other one is written 0.
//
// The work is split over `ctas` CTAs in tile units: CTA c takes the kept tiles' stretch
// [c * kept / ctas, (c + 1) * kept / ctas), cut at tile boundaries into pieces, each piece a
// fraction of one tile's pixel loop. The pixel tiles are walked in `phases` windows, one after
// the other, and each piece takes its fraction of every window, so that all CTAs read the
// same window of dy and x at a time and it stays in L2; each CTA's work per window is within
// two pixel tiles of the others'. A piece's sums over the windows stay in registers (a CTA
// holds at most two pieces when phases > 1: callers ask for one phase when kept > ctas, and
// get one then), and each piece's total goes to its own fp32 partial slot. A kept tile's
// slots are consecutive, in CTA order, and are added in that order: the same bits every run.
struct FilterSplit {
  int tile_m = 0, tile_n = 0, tile_k = 0;
  int m_tiles = 0;                  // ceil(K / tile_m)
  int n_tiles = 0;                  // ceil(C / tile_n) * R * S
  int k_tiles = 0;                  // ceil(N * P * Q / tile_k)
  int phases = 0;                   // the phases asked for, at most k_tiles; 1 when kept > ctas
  int ctas = 0;                     // min(the ctas asked for, kept * k_tiles)
  std::vector<int32_t> slot;        // [m_tiles * n_tiles]: kept-tile number, or -1
  std::vector<int32_t> kept_tiles;  // [kept]: the tile, m * n_tiles + n
  std::vector<int32_t> tile_begin;  // [kept + 1]: each kept tile's first partial slot
  // Per segment, CTA by CTA and within a CTA window by window: its kept-tile number, first
  // pixel tile and pixel tiles (at least 1), the running sum it adds to (its piece within the
  // CTA, 0 or 1; always 0 with one phase), and the partial slot that sum is stored to and
  // cleared after it (the piece's last segment), or -1.
  std::vector<int32_t> seg_tile, seg_k, seg_count, seg_piece, seg_store;
  std::vector<int32_t> cta_begin;  // [ctas + 1]: each CTA's first segment
  int kept() const { return static_cast<int>(kept_tiles.size()); }
  int partials() const { return tile_begin.empty() ? 0 : tile_begin.back(); }
};

// REQUIRES: CheckBlockGrid(shape, grid).ok(), tile sides > 0, phases > 0, ctas > 0.
FilterSplit MakeFilterSplit(const ConvShape& shape, const BlockGrid& grid, int tile_m, int tile_n,
                            int tile_k, int phases, int ctas);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_KEPT_TILES_H_
