#include "kernels/sparse/kept_tiles.h"

#include <algorithm>

namespace topiary::kernels {

double KeptTiles::density() const {
  int64_t kept = 0;
  for (int32_t c : count) kept += c;
  const int64_t all = static_cast<int64_t>(k_tiles) * n_tiles;
  return all > 0 ? static_cast<double>(kept) / all : 1.0;
}

KeptTiles MakeKeptTiles(SparsePass pass, const ConvShape& s, const BlockGrid& grid, int tile_k,
                        int tile_n) {
  // The reduction side (K of the GEMM) and the output side (N), in channels and blocks.
  const bool fwd = pass == SparsePass::kForward;
  const int red = fwd ? s.c : s.k, out = fwd ? s.k : s.c;
  const int red_block = fwd ? grid.block_in : grid.block_out;
  const int out_block = fwd ? grid.block_out : grid.block_in;
  KeptTiles t;
  t.tile_k = tile_k;
  t.tile_n = tile_n;
  const int c_tiles = (red + tile_k - 1) / tile_k;
  t.k_tiles = c_tiles * s.r * s.s;
  t.n_tiles = (out + tile_n - 1) / tile_n;
  // needs[j][c_tile]: output tile j reads reduction tile c_tile (the same at every tap).
  std::vector<uint8_t> needs(static_cast<size_t>(t.n_tiles) * c_tiles, 0);
  for (int row = 0; row < grid.rows; ++row) {
    for (int col = 0; col < grid.cols; ++col) {
      if (!grid.Kept(row, col)) continue;
      const int rb = fwd ? row : col, ob = fwd ? col : row;
      const int c0 = rb * red_block, c1 = std::min(red, c0 + red_block);
      const int k0 = ob * out_block, k1 = std::min(out, k0 + out_block);
      for (int j = k0 / tile_n; j <= (k1 - 1) / tile_n; ++j) {
        for (int ct = c0 / tile_k; ct <= (c1 - 1) / tile_k; ++ct) {
          needs[static_cast<size_t>(j) * c_tiles + ct] = 1;
        }
      }
    }
  }
  int per_tap_max = 0;
  for (int j = 0; j < t.n_tiles; ++j) {
    int n = 0;
    for (int ct = 0; ct < c_tiles; ++ct) n += needs[static_cast<size_t>(j) * c_tiles + ct];
    per_tap_max = std::max(per_tap_max, n);
  }
  t.stride = std::max(1, per_tap_max * s.r * s.s);
  t.count.assign(t.n_tiles, 0);
  t.index.assign(static_cast<size_t>(t.n_tiles) * t.stride, 0);
  for (int j = 0; j < t.n_tiles; ++j) {
    int32_t* out = &t.index[static_cast<size_t>(j) * t.stride];
    int n = 0;
    for (int tap = 0; tap < s.r * s.s; ++tap) {  // tap = s_col + S * r_row: ascending numbers
      for (int ct = 0; ct < c_tiles; ++ct) {
        if (needs[static_cast<size_t>(j) * c_tiles + ct]) out[n++] = ct + c_tiles * tap;
      }
    }
    t.count[j] = n;
  }
  return t;
}

}  // namespace topiary::kernels
