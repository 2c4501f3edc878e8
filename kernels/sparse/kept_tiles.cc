#include "kernels/sparse/kept_tiles.h"

#include <algorithm>

namespace topiary::kernels {

double KeptTiles::density() const {
  int64_t kept = 0;
  for (int32_t c : count) kept += c;
  const int64_t all = static_cast<int64_t>(k_tiles) * n_tiles;
  return all > 0 ? static_cast<double>(kept) / all : 1.0;
}

namespace {

// cover[kt * c_tiles + ct]: some kept block overlaps the output channels of tile kt (tiles of
// k_side channels over K) and the input channels of tile ct (c_side channels over C), the
// same at every tap.
std::vector<uint8_t> BlockCover(const ConvShape& s, const BlockGrid& grid, int k_side, int c_side) {
  const int c_tiles = (s.c + c_side - 1) / c_side;
  std::vector<uint8_t> cover(static_cast<size_t>((s.k + k_side - 1) / k_side) * c_tiles, 0);
  for (int row = 0; row < grid.rows; ++row) {
    for (int col = 0; col < grid.cols; ++col) {
      if (!grid.Kept(row, col)) continue;
      const int c0 = row * grid.block_in, c1 = std::min(s.c, c0 + grid.block_in);
      const int k0 = col * grid.block_out, k1 = std::min(s.k, k0 + grid.block_out);
      for (int kt = k0 / k_side; kt <= (k1 - 1) / k_side; ++kt) {
        for (int ct = c0 / c_side; ct <= (c1 - 1) / c_side; ++ct) {
          cover[static_cast<size_t>(kt) * c_tiles + ct] = 1;
        }
      }
    }
  }
  return cover;
}

}  // namespace

KeptTiles MakeKeptTiles(SparsePass pass, const ConvShape& s, const BlockGrid& grid, int tile_k,
                        int tile_n) {
  // The reduction side (K of the GEMM) and the output side (N), in channels.
  const bool fwd = pass == SparsePass::kForward;
  const int red = fwd ? s.c : s.k, out = fwd ? s.k : s.c;
  KeptTiles t;
  t.tile_k = tile_k;
  t.tile_n = tile_n;
  const int c_tiles = (red + tile_k - 1) / tile_k;
  t.k_tiles = c_tiles * s.r * s.s;
  t.n_tiles = (out + tile_n - 1) / tile_n;
  // needs(j, c_tile): output tile j reads reduction tile c_tile (the same at every tap).
  const std::vector<uint8_t> cover =
      fwd ? BlockCover(s, grid, tile_n, tile_k) : BlockCover(s, grid, tile_k, tile_n);
  auto needs = [&](int j, int ct) {
    return cover[fwd ? static_cast<size_t>(j) * c_tiles + ct
                     : static_cast<size_t>(ct) * t.n_tiles + j] != 0;
  };
  int per_tap_max = 0;
  for (int j = 0; j < t.n_tiles; ++j) {
    int n = 0;
    for (int ct = 0; ct < c_tiles; ++ct) n += needs(j, ct);
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
        if (needs(j, ct)) out[n++] = ct + c_tiles * tap;
      }
    }
    t.count[j] = n;
  }
  return t;
}

FilterSplit MakeFilterSplit(const ConvShape& s, const BlockGrid& grid, int tile_m, int tile_n,
                            int tile_k, int phases, int ctas) {
  FilterSplit f;
  f.tile_m = tile_m;
  f.tile_n = tile_n;
  f.tile_k = tile_k;
  f.m_tiles = (s.k + tile_m - 1) / tile_m;
  const int c_tiles = (s.c + tile_n - 1) / tile_n;
  f.n_tiles = c_tiles * s.r * s.s;
  const int64_t pixels = static_cast<int64_t>(s.n) * s.ho() * s.wo();
  f.k_tiles = static_cast<int>((pixels + tile_k - 1) / tile_k);
  const std::vector<uint8_t> covers = BlockCover(s, grid, tile_m, tile_n);  // [m][c_tile]
  f.slot.assign(static_cast<size_t>(f.m_tiles) * f.n_tiles, -1);
  for (int m = 0; m < f.m_tiles; ++m) {
    for (int n = 0; n < f.n_tiles; ++n) {
      if (!covers[static_cast<size_t>(m) * c_tiles + n % c_tiles]) continue;
      f.slot[static_cast<size_t>(m) * f.n_tiles + n] = f.kept();
      f.kept_tiles.push_back(m * f.n_tiles + n);
    }
  }
  const int64_t kept = f.kept();
  f.ctas = static_cast<int>(std::min<int64_t>(ctas, kept * f.k_tiles));
  f.phases = kept > f.ctas ? 1 : std::max(1, std::min(phases, f.k_tiles));
  const int64_t units = f.ctas;  // tile units per kept tile: CTA c takes kept of them
  auto window = [&](int phase) { return int64_t{f.k_tiles} * phase / f.phases; };
  // A piece's pixel tiles in window p: its units [a, b) of the tile scaled to the window.
  auto range = [&](int p, int64_t a, int64_t b) {
    const int64_t w0 = window(p), width = window(p + 1) - w0;
    return std::pair<int64_t, int64_t>{w0 + a * width / units, w0 + b * width / units};
  };
  struct Piece {
    int32_t tile;
    int64_t a, b;  // its units of the tile
  };
  std::vector<std::vector<Piece>> pieces(f.ctas);
  f.tile_begin.assign(kept + 1, 0);
  for (int c = 0; c < f.ctas; ++c) {
    const int64_t begin = c * kept, end = (c + 1) * kept;
    for (int64_t at = begin; at < end;) {
      const int64_t tile = at / units, stop = std::min(end, (tile + 1) * units);
      const Piece piece{static_cast<int32_t>(tile), at - tile * units, stop - tile * units};
      int64_t count = 0;
      for (int p = 0; p < f.phases; ++p) {
        const auto [k0, k1] = range(p, piece.a, piece.b);
        count += k1 - k0;
      }
      if (count > 0) {
        pieces[c].push_back(piece);
        ++f.tile_begin[tile + 1];
      }
      at = stop;
    }
  }
  // Partial slots: tile by tile, and within a tile CTA by CTA (the order CTAs are walked in).
  for (int64_t t = 0; t < kept; ++t) f.tile_begin[t + 1] += f.tile_begin[t];
  std::vector<int32_t> next_slot(f.tile_begin.begin(), f.tile_begin.end() - 1);
  f.cta_begin.push_back(0);
  for (int c = 0; c < f.ctas; ++c) {
    const std::vector<Piece>& mine = pieces[c];
    std::vector<int32_t> slot(mine.size());
    std::vector<int> last(mine.size(), -1);  // each piece's last window with pixel tiles
    for (size_t i = 0; i < mine.size(); ++i) {
      slot[i] = next_slot[mine[i].tile]++;
      for (int p = 0; p < f.phases; ++p) {
        const auto [k0, k1] = range(p, mine[i].a, mine[i].b);
        if (k1 > k0) last[i] = p;
      }
    }
    for (int p = 0; p < f.phases; ++p) {
      for (size_t i = 0; i < mine.size(); ++i) {
        const auto [k0, k1] = range(p, mine[i].a, mine[i].b);
        if (k1 == k0) continue;
        f.seg_tile.push_back(mine[i].tile);
        f.seg_k.push_back(static_cast<int32_t>(k0));
        f.seg_count.push_back(static_cast<int32_t>(k1 - k0));
        f.seg_piece.push_back(f.phases > 1 ? static_cast<int32_t>(i) : 0);
        f.seg_store.push_back(p == last[i] ? slot[i] : -1);
      }
    }
    f.cta_begin.push_back(static_cast<int32_t>(f.seg_tile.size()));
  }
  return f;
}

}  // namespace topiary::kernels
