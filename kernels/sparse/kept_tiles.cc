#include "kernels/sparse/kept_tiles.h"

#include <algorithm>
#include <functional>

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

// The orders (KeptOrder) in which the output tiles walk the channel tiles they need (needs(j,
// ct)). The output tiles of a band run side by side on neighbouring CTAs and walk their lists
// at about the same pace, so the order decides which channel tiles' activations they read
// from DRAM at the same time. Measured on the H200 (docs/PERFORMANCE.md, issue 44; 64x64
// blocks, 50% kept, layer3 s2):
// - The halo forward (halo_conv.h): rotated. Two output tiles that need the same block then
//   tend to read it together, one DRAM read for both, and each place of the lists brings about
//   the same share of first reads: 0.0577 -> 0.0560 ms against ascending. The edge colouring
//   (every tile a different block at each place: all first reads at the first place, none
//   after) ran 0.0581 ms against the rotation's 0.0554.
// - The halo backward data (one launch for the phases): coloured, 0.0618 -> 0.0608 ms against
//   ascending (its tiles load a group's bands of dy together, before multiplying).
// - The im2col kernels (hopper_conv.h), whose neighbouring CTAs multiply the same pixels
//   by different channel tiles: ascending (coloured backward data measured 1-1.5% slower at
//   layer4, rotated forward no faster).
//
// Each tile's channel tiles ascending: kAscending, or with `rotate` from output tile j's (j mod
// kept)-th on, kRotated.
std::vector<std::vector<int>> AscendingOrder(int n_tiles, int c_tiles,
                                             const std::function<bool(int, int)>& needs,
                                             bool rotate) {
  std::vector<std::vector<int>> order(n_tiles);
  for (int j = 0; j < n_tiles; ++j) {
    std::vector<int> ascending;
    for (int ct = 0; ct < c_tiles; ++ct) {
      if (needs(j, ct)) ascending.push_back(ct);
    }
    const size_t kept = ascending.size(), first = rotate && kept > 0 ? j % kept : 0;
    for (size_t b = 0; b < kept; ++b) order[j].push_back(ascending[(b + first) % kept]);
  }
  return order;
}

// A proper edge colouring of the bipartite graph of output tiles and channel tiles (an edge
// where a tile needs one) with as many colours as the most edges at a vertex (König: a
// bipartite graph always has one), each tile's channel tiles in the order of their edges'
// colours: where every vertex has that many edges (a balanced grid), no two tiles name the
// same channel tile at the same place of their lists.
//
// Edges are coloured one at a time: with colour a free at the tile and b free at the channel
// tile, if a is taken at the channel tile, the path from it that alternates a and b is
// recoloured (a <-> b), which frees a there; the path cannot reach the tile (it enters output
// tiles by edges of colour a, which the tile has none of).
std::vector<std::vector<int>> ColourOrder(int n_tiles, int c_tiles,
                                          const std::function<bool(int, int)>& needs) {
  int colours = 0;
  std::vector<int> c_degree(c_tiles, 0);
  for (int j = 0; j < n_tiles; ++j) {
    int degree = 0;
    for (int ct = 0; ct < c_tiles; ++ct) {
      if (!needs(j, ct)) continue;
      ++degree;
      colours = std::max(colours, ++c_degree[ct]);
    }
    colours = std::max(colours, degree);
  }
  // at_tile[j][c]: the channel tile of tile j's edge of colour c, or -1; at_channel likewise.
  std::vector<int> at_tile(static_cast<size_t>(n_tiles) * colours, -1);
  std::vector<int> at_channel(static_cast<size_t>(c_tiles) * colours, -1);
  auto tile_slot = [&](int j, int c) -> int& {
    return at_tile[static_cast<size_t>(j) * colours + c];
  };
  auto channel_slot = [&](int ct, int c) -> int& {
    return at_channel[static_cast<size_t>(ct) * colours + c];
  };
  auto free_colour = [&](auto slot, int v) {
    int c = 0;
    while (slot(v, c) != -1) ++c;  // fewer edges than colours at every vertex being coloured
    return c;
  };
  struct Edge {
    int j, ct, colour;
  };
  std::vector<Edge> path;
  for (int j = 0; j < n_tiles; ++j) {
    for (int ct = 0; ct < c_tiles; ++ct) {
      if (!needs(j, ct)) continue;
      const int a = free_colour(tile_slot, j), b = free_colour(channel_slot, ct);
      path.clear();
      for (int v = ct, c = a, tile_side = 0;;) {  // from ct along colours a, b, a, ...
        const int next = tile_side ? tile_slot(v, c) : channel_slot(v, c);
        if (next == -1) break;
        path.push_back(tile_side ? Edge{v, next, c} : Edge{next, v, c});
        v = next;
        tile_side = !tile_side;
        c = c == a ? b : a;
      }
      for (const Edge& e : path) tile_slot(e.j, e.colour) = channel_slot(e.ct, e.colour) = -1;
      for (const Edge& e : path) {
        const int c = e.colour == a ? b : a;
        tile_slot(e.j, c) = e.ct;
        channel_slot(e.ct, c) = e.j;
      }
      tile_slot(j, a) = ct;
      channel_slot(ct, a) = j;
    }
  }
  std::vector<std::vector<int>> order(n_tiles);
  for (int j = 0; j < n_tiles; ++j) {
    for (int c = 0; c < colours; ++c) {
      if (tile_slot(j, c) != -1) order[j].push_back(tile_slot(j, c));
    }
  }
  return order;
}

}  // namespace

KeptTiles MakeKeptTiles(SparsePass pass, const ConvShape& s, const BlockGrid& grid, int tile_k,
                        int tile_n, KeptOrder order_kind) {
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
  const std::vector<std::vector<int>> order =
      order_kind == KeptOrder::kColoured
          ? ColourOrder(t.n_tiles, c_tiles, needs)
          : AscendingOrder(t.n_tiles, c_tiles, needs, order_kind == KeptOrder::kRotated);
  size_t per_tap_max = 0;
  for (const std::vector<int>& o : order) per_tap_max = std::max(per_tap_max, o.size());
  t.stride = std::max(1, static_cast<int>(per_tap_max) * s.r * s.s);
  t.count.assign(t.n_tiles, 0);
  t.index.assign(static_cast<size_t>(t.n_tiles) * t.stride, 0);
  for (int j = 0; j < t.n_tiles; ++j) {
    int32_t* out = &t.index[static_cast<size_t>(j) * t.stride];
    int n = 0;
    for (int tap = 0; tap < s.r * s.s; ++tap) {  // tap = s_col + S * r_row, ascending
      for (int ct : order[j]) out[n++] = ct + c_tiles * tap;
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
