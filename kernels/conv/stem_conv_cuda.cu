// bf16 convolutions of images with few channels on tensor cores (see stem_conv.h).
//
// Forward: a block owns 64 output channels, with the filters in shared memory once; each of its
// warps walks units of two tiles of 16 output pixels of one output row (persistent, one wave of
// resident blocks), stages the tiles' input windows in its own area of shared memory and reads
// the A fragments straight from them (StemForwardKernel says how), multiplying with
// mma.sync.m16n8k16 (fp32 sums) and storing bf16 rows through the same area in 16-byte vectors.
//
// Backward filter: dw^T = A^T dy summed over the output pixels, with A's row for a pixel its
// receptive field by the forward's runs of 8 values per filter row. The reduction runs over
// pixels, which the tensor cores take in pairs; pairing pixels p and p + 8 of a tile (the sum's
// order is free), each A^T fragment register is one 4-byte word of a "paired window" whose
// word e holds value e of the window row for both pixels, staged as the forward stages its
// windows. dy's fragments come by ldmatrix.trans in the same pixel order (StemBackwardFilter-
// Kernel). A block of 8 warps (4 x 2 over runs and channels) owns 64 output channels and a
// fixed range of tiles (one wave of resident blocks), eight tiles per stage. The blocks' fp32
// sums go to the workspace, and a second kernel adds them per weight in block order: the same
// bits on every run.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_format.h"
#include "kernels/conv/split_sums.cuh"
#include "kernels/conv/stem_conv.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "kernels/runtime/warp_mma.cuh"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

// Output channels per block: 64 where K allows (resnet50's stem), else 16 (resnet20's, K = 16).
constexpr int kWideK = 64, kNarrowK = 16;
constexpr int kTilePixels = 16;  // output pixels of a forward tile: one m16 tile of one row
constexpr int kWarpTiles = 2;    // forward tiles a warp multiplies together
constexpr int kFwdWarps = 4;
constexpr int kWgThreads = 256;  // backward filter: 8 warps, 4 x 2 over runs and channels
constexpr int kWgTiles = 8;      // backward-filter tiles per stage: one staged per warp
constexpr int kBlockThreads = 128;
constexpr int kMaxSmem = 96 * 1024;  // at least two blocks per multiprocessor
constexpr int kMaxChannels = 4;
constexpr int kMaxRow = 256;     // the most values of a receptive field in runs of 8
constexpr int kMaxSegment = 32;  // the most values of one filter row (S * C)

int ChannelTile(int k) { return k % kWideK == 0 ? kWideK : kNarrowK; }

struct Geometry {
  int h, w, c, k, r, s, stride_h, stride_w, pad_h, pad_w, ho, wo;
  int64_t pixels;  // N * Ho * Wo
  int64_t rows;    // N * Ho
  int patch;       // R * S * C
  int tile_k;      // output channels per block (ChannelTile)
};

Geometry MakeGeometry(const ConvShape& s) {
  Geometry g;
  g.h = s.h, g.w = s.w, g.c = s.c, g.k = s.k, g.r = s.r, g.s = s.s;
  g.stride_h = s.stride_h, g.stride_w = s.stride_w, g.pad_h = s.pad_h, g.pad_w = s.pad_w;
  g.ho = s.ho(), g.wo = s.wo();
  g.rows = static_cast<int64_t>(s.n) * g.ho;
  g.pixels = g.rows * g.wo;
  g.patch = s.patch();
  g.tile_k = ChannelTile(s.k);
  return g;
}

// The forward pass's layout. K (the reduction) is a sequence of halves, 8 values each: filter
// row r's S*C values are its halves r * hr .. r * hr + hr - 1 (hr = ceil(S*C / 8), the last one
// zero-padded), so that half h reads values (h % hr) * 8 .. + 7 of filter row h / hr, and the
// halves are padded to an even count (whole k16 steps; the padding half is zero in B).
struct Halves {
  int hr;     // halves per filter row
  int count;  // R * hr rounded up to even
  int sc;     // stride_w * C: the values between neighbouring pixels' fields in a window row
  int lr;     // elements of a window row: a tile's 16 fields of one filter row, all halves
  int ldb;    // elements between filters in shared memory
};

Halves MakeHalves(const ConvShape& s) {
  Halves v;
  v.hr = (s.s * s.c + 7) / 8;
  v.count = (s.r * v.hr + 1) / 2 * 2;
  v.sc = s.stride_w * s.c;
  v.lr = ((kTilePixels - 1) * v.sc + v.hr * 8 + 1) / 2 * 2;
  v.ldb = v.count * 8 + 8;  // 16 bytes more than whole k16 steps: ldmatrix's rows in distinct banks
  return v;
}

// Forward tiles: 16 output pixels of one output row each.
__host__ __device__ inline int64_t FwdTiles(const Geometry& g) {
  return g.rows * ((g.wo + kTilePixels - 1) / kTilePixels);
}

// Elements of one warp's window area: its tiles' windows, or the output staging
// [kWarpTiles * 16 pixels][tile_k + 8] that reuses it after the multiply (rounded to 8: every
// area starts 16-byte aligned).
__host__ __device__ int WarpArea(const Geometry& g, const Halves& v) {
  const int windows = kWarpTiles * g.r * v.lr;
  const int out = kWarpTiles * kTilePixels * (g.tile_k + 8);
  return ((windows > out ? windows : out) + 7) / 8 * 8;
}

// Two neighbouring bf16 values from shared memory as one register (the first in the low half);
// kEven: p is 4-byte aligned.
template <bool kEven>
__device__ __forceinline__ uint32_t Pair(const uint16_t* p) {
  if constexpr (kEven) {
    return Lds32(p);
  } else {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 16;
  }
}

// Where a forward tile (16 output pixels of one output row) lies. Tiles are counted in 32 bits
// (StemConvSupported): one division by a 32-bit divisor is a few instructions, a 64-bit one
// dozens, and every unit locates two tiles.
struct FwdTile {
  int64_t first;           // its first output pixel (n, ho, wo0) in NHW order
  int n, ho, wo0, pixels;  // pixels: how many of the 16 are in the row (0: past the end)
};

__device__ FwdTile LocateTile(const Geometry& g, unsigned tile, unsigned tiles) {
  FwdTile f{0, 0, 0, 0, 0};
  if (tile >= tiles) return f;
  const unsigned per_row = (g.wo + kTilePixels - 1) / kTilePixels;
  const unsigned row = tile / per_row;
  f.wo0 = static_cast<int>(tile - row * per_row) * kTilePixels;
  f.ho = static_cast<int>(row % static_cast<unsigned>(g.ho));
  f.n = static_cast<int>(row / static_cast<unsigned>(g.ho));
  f.first = static_cast<int64_t>(row) * g.wo + f.wo0;
  f.pixels = min(kTilePixels, g.wo - f.wo0);
  return f;
}

// Which two values of a tile's window row a staged 4-byte word holds: word i pairs values
// step * i and step * i + dist, for i < words. The forward pairs neighbours (step 2, dist 1:
// the plain window, lr / 2 words); the backward filter pairs the same place in the fields of
// pixels p and p + 8 (step 1, dist 8 * sc), its reduction's pixel pairs.
struct WordPairs {
  int step, dist, words;
};

// A warp's tiles' window rows: row r of a tile's window holds input row ho * stride - pad + r
// from element column (wo0 * stride - pad) * C on, lr values (zeros outside the image and past
// the tile's last pixel's field, so that a partial tile's missing pixels read zeros), so that
// pixel p's field of that filter row starts at p * sc; staged as the words `pairs` says. A lane
// takes words i = lane, lane + 32, ... (kSlots of them) of kStageRows rows of every tile
// (coalesced loads) and issues all their loads before it stores them, store(tile, row, i,
// word): the warp waits on memory once per kStageRows rows. The columns' edges are tested once
// for all rows.
constexpr int kStageRows = 4;

template <int kTiles, int kSlots, typename Store>
__device__ void StageWindows(const Geometry& g, const Halves& v, const WordPairs& pairs,
                             const uint16_t* __restrict__ x, const FwdTile (&tile)[kTiles],
                             int lane, Store store) {
  const int row_values = g.w * g.c;
  for (int i0 = 0; i0 < pairs.words; i0 += 32 * kSlots) {
    bool lo_ok[kTiles][kSlots], hi_ok[kTiles][kSlots];
    int e[kTiles][kSlots];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const int col0 = (tile[t].wo0 * g.stride_w - g.pad_w) * g.c;
      const int fields = (tile[t].pixels - 1) * v.sc + g.s * g.c;  // values the pixels read
#pragma unroll
      for (int sl = 0; sl < kSlots; ++sl) {
        const int i = i0 + lane + 32 * sl, lo = pairs.step * i, hi = lo + pairs.dist;
        e[t][sl] = col0 + lo;
        const bool word = i < pairs.words;
        lo_ok[t][sl] = word && lo < fields && col0 + lo >= 0 && col0 + lo < row_values;
        hi_ok[t][sl] = word && hi < fields && col0 + hi >= 0 && col0 + hi < row_values;
      }
    }
    for (int r0 = 0; r0 < g.r; r0 += kStageRows) {
      uint32_t val[kStageRows][kTiles][kSlots];
#pragma unroll
      for (int rr = 0; rr < kStageRows; ++rr) {
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          const int h = tile[t].ho * g.stride_h - g.pad_h + r0 + rr;
          const bool in = r0 + rr < g.r && tile[t].pixels > 0 && h >= 0 && h < g.h;
          // 32-bit offsets (StemConvSupported: the image has fewer than 2^31 values), so that a
          // load's address is one multiply-add from x.
          const int row = (tile[t].n * g.h + (in ? h : 0)) * row_values;
#pragma unroll
          for (int sl = 0; sl < kSlots; ++sl) {
            const uint16_t* p = x + (row + e[t][sl]);
            const uint32_t lo = in && lo_ok[t][sl] ? __ldg(p) : 0u;
            const uint32_t hi = in && hi_ok[t][sl] ? __ldg(p + pairs.dist) : 0u;
            val[rr][t][sl] = lo | hi << 16;
          }
        }
      }
#pragma unroll
      for (int rr = 0; rr < kStageRows; ++rr) {
        if (r0 + rr >= g.r) break;
#pragma unroll
        for (int sl = 0; sl < kSlots; ++sl) {
          const int i = i0 + lane + 32 * sl;
          if (i >= pairs.words) continue;
#pragma unroll
          for (int t = 0; t < kTiles; ++t) store(t, r0 + rr, i, val[rr][t][sl]);
        }
      }
    }
  }
}

// Forward: each warp walks units of kWarpTiles tiles (16 output pixels of one output row each)
// for the block's kK output channels. It stages the tiles' windows (StageWindows) in its own
// area of shared memory and reads the A fragments straight from them: pixel p's values of half h
// are window row h / hr at p * sc + (h % hr) * 8, no im2col. The filters are in shared memory
// once per block, in the halves' order, read with ldmatrix. The fp32 sums go out through the
// same area as bf16 rows of kK channels, in 16-byte stores. kEven: sc is even, so every pair a
// fragment register takes is 4-byte aligned.
template <int kK, bool kEven>
__global__ void __launch_bounds__(kBlockThreads, 4)
    StemForwardKernel(Geometry g, Halves v, const uint16_t* __restrict__ x,
                      const uint16_t* __restrict__ w, __nv_bfloat16* __restrict__ y) {
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr int kNt = kK / 8;  // n8 tiles of the block's channels
  uint16_t* b = smem;          // [kK][ldb]: the filters, by halves
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, qr = lane / 4, qc = (lane % 4) * 2;
  uint16_t* area = smem + kK * v.ldb + warp * WarpArea(g, v);
  const int k0 = blockIdx.y * kK;
  const int seg = g.s * g.c;
  for (int i = t; i < kK * v.count * 8; i += kBlockThreads) {
    const int n = i / (v.count * 8), k = i - n * v.count * 8, h = k / 8;
    const int r = h / v.hr, j = (h - r * v.hr) * 8 + k % 8;
    b[n * v.ldb + k] =
        r < g.r && j < seg ? w[static_cast<int64_t>(k0 + n) * g.patch + r * seg + j] : uint16_t{0};
  }
  __syncthreads();
  const unsigned tiles = static_cast<unsigned>(FwdTiles(g));
  const unsigned units = (tiles + kWarpTiles - 1) / kWarpTiles;
  const int halves = g.r * v.hr;
  const int lane_at = qc + qr * v.sc;  // the lane's pixel and value pair in a half
  // The lane's row of ldmatrix's four matrices (LdMatrixX4's order) in the first k16 step.
  const uint16_t* b_lane = b + ((lane / 16) * 8 + lane % 8) * v.ldb + ((lane / 8) % 2) * 8;
  for (unsigned unit = blockIdx.x * kFwdWarps + warp; unit < units; unit += gridDim.x * kFwdWarps) {
    FwdTile tile[kWarpTiles];
#pragma unroll
    for (int i = 0; i < kWarpTiles; ++i) tile[i] = LocateTile(g, unit * kWarpTiles + i, tiles);
    const int words = g.r * v.lr / 2;  // of a tile's window
    StageWindows<kWarpTiles, 2>(
        g, v, {2, 1, v.lr / 2}, x, tile, lane, [&](int t, int r, int i, uint32_t pair) {
          reinterpret_cast<uint32_t*>(area)[t * words + r * (v.lr / 2) + i] = pair;
        });
    __syncwarp();
    float acc[kWarpTiles][kNt][4] = {};
    // The window offset of the next half (its filter row's, plus 8 per earlier run of the row)
    // and its run within the row, advanced half by half: no division in the loop.
    int off = 0, run = 0;
    auto next_half = [&] {
      const int at = off;
      if (++run == v.hr) {
        run = 0;
        off += v.lr - (v.hr - 1) * 8;
      } else {
        off += 8;
      }
      return at;
    };
    for (int step = 0; step < v.count / 2; ++step) {
      uint32_t bf[kNt][2];
#pragma unroll
      for (int q = 0; q < kK / 16; ++q) {
        // Matrices 0, 1: filters 16q..16q+7, the step's two halves; 2, 3: filters 16q+8..16q+15.
        uint32_t m[4];
        LdMatrixX4(m, b_lane + q * 16 * v.ldb + step * 16);
        bf[2 * q][0] = m[0], bf[2 * q][1] = m[1], bf[2 * q + 1][0] = m[2], bf[2 * q + 1][1] = m[3];
      }
      // The step's two halves; a padding half (zero filters) reads the first row, not past the
      // window.
      const int at0 = next_half() + lane_at;
      const int at1 = (2 * step + 1 < halves ? next_half() : 0) + lane_at;
#pragma unroll
      for (int i = 0; i < kWarpTiles; ++i) {
        const uint16_t* win = area + i * g.r * v.lr;
        const uint32_t a[4] = {Pair<kEven>(win + at0), Pair<kEven>(win + at0 + 8 * v.sc),
                               Pair<kEven>(win + at1), Pair<kEven>(win + at1 + 8 * v.sc)};
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) MmaBf16(acc[i][nt], a, bf[nt][0], bf[nt][1]);
      }
    }
    __syncwarp();  // every lane has read the windows before the sums overwrite them
    constexpr int ldo = (kK + 8) / 2;  // words per staged pixel: 16 bytes more than its channels
    auto* out = reinterpret_cast<uint32_t*>(area);
#pragma unroll
    for (int i = 0; i < kWarpTiles; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int p = i * kTilePixels + half * 8 + qr;
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          const __nv_bfloat162 o =
              __floats2bfloat162_rn(acc[i][nt][2 * half], acc[i][nt][2 * half + 1]);
          out[p * ldo + nt * 4 + qc / 2] = *reinterpret_cast<const uint32_t*>(&o);
        }
      }
    }
    __syncwarp();
    // kK / 8 lanes per pixel, 16 bytes each: a warp stores 256 / kK pixels at a time.
    constexpr int kLanes = kK / 8, kPixels = 32 / kLanes;
#pragma unroll
    for (int it = 0; it < kWarpTiles * kTilePixels / kPixels; ++it) {
      const int i = it * kPixels / kTilePixels, q = it * kPixels % kTilePixels + lane / kLanes;
      const int p = i * kTilePixels + q, c = lane % kLanes;
      if (q < tile[i].pixels) {
        *reinterpret_cast<uint4*>(y + (tile[i].first + q) * g.k + k0 + c * 8) =
            *reinterpret_cast<const uint4*>(out + p * ldo + c * 4);
      }
    }
    __syncwarp();  // the stores have read the area before the next unit's windows
  }
}

// The backward filter's shared memory: the stage's dy rows [kWgTiles * 16][kK + 8] and
// each tile's paired window [R][words] (4-byte words, WordPairs{1, 8 * sc, words}: word e of
// row r holds value e of pixels 0-7's window row and value e of pixels 8-15's, words =
// 7 * sc + 8 * hr, all that pixels 0-7's runs read).
struct WgradLayout {
  int words;  // of a paired window row
  int tile;   // 4-byte words of a tile's paired window
};

WgradLayout MakeWgradLayout(const Geometry& g, const Halves& v) {
  const int words = 7 * v.sc + 8 * v.hr;
  return {words, (g.r * words + 3) / 4 * 4};
}

// The backward filter: dw^T [runs * 8][kK channels] += A^T dy over the block's tiles, A's rows
// the pixels' fields by runs of 8 values (the forward's halves, here "runs": run u is values
// (u % hr) * 8 .. + 7 of filter row u / hr). The reduction runs over a tile's 16 pixels, which
// the tensor cores take in pairs of neighbouring k; the order of a sum's terms is free, so k
// pair j is pixels j and j + 8 (k = 2j + b is pixel j + 8b), and each register of A^T's
// fragment, (run value m, pixels j and j + 8), is one word of the paired window: word
// j * sc + m of the run's filter row. dy's rows are stored in the same order, and its B
// fragments read with ldmatrix.trans. So nothing is gathered: per stage each warp stages one
// tile's paired window and issues cp.async copies of its dy rows, then the warps multiply.
// The m16 tiles of dw^T pair runs 2i and 2i + 1; warp (wm, wn) takes MT of them for kK / 2
// channels. A run's values past its filter row's S*C (the next pixel's, or zeros) make rows
// of dw^T that are not written; a missing pixel's field reads zeros and its dy row is zero.
template <int kK, int MT>
__global__ void __launch_bounds__(kWgThreads, 2)
    StemBackwardFilterKernel(Geometry g, Halves v, WgradLayout lay, const uint16_t* __restrict__ x,
                             const uint16_t* __restrict__ dy, unsigned per_block,
                             float* __restrict__ part) {
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr int ldd = kK + 8;  // 16 bytes more than the channels: ldmatrix's rows in distinct banks
  constexpr int kNt = kK / 16;  // n8 tiles of a warp's channels
  uint16_t* d = smem;           // [kWgTiles * 16 pixels][ldd]: the stage's output gradients
  auto* windows = reinterpret_cast<uint32_t*>(d + kWgTiles * kTilePixels * ldd);
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, qr = lane / 4, qc = (lane % 4) * 2;
  const int wm = warp / 2, wn = warp % 2;
  const int k0 = blockIdx.y * kK;
  const unsigned tiles = static_cast<unsigned>(FwdTiles(g));
  const unsigned begin = blockIdx.x * per_block;
  const unsigned end = begin + per_block < tiles ? begin + per_block : tiles;
  const int runs = g.r * v.hr, seg = g.s * g.c;
  // Per m-tile the byte offsets in a paired window of the lane's four fragment words: its two
  // runs' row qr, pixel pairs qc / 2 and qc / 2 + 4. A padding run (past the last, also the
  // m-tiles past the last of a warp with fewer: it multiplies all MT, no branch) reads run 0,
  // and its rows are not written.
  int a_at[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int u = 2 * (wm * MT + mt) + h;
      const int word = (u < runs ? u / v.hr * lay.words + u % v.hr * 8 : 0) + qr + qc / 2 * v.sc;
      a_at[mt][h] = 4 * word;
      a_at[mt][h + 2] = 4 * (word + 4 * v.sc);
    }
  }
  uint32_t* mine = windows + warp * lay.tile;  // the paired window this warp stages
  float acc[MT][kNt][4] = {};
  constexpr int kLanes = kK / 8, kPixels = 32 / kLanes;  // per pixel's row; per copy
  for (unsigned t0 = begin; t0 < end; t0 += kWgTiles) {
    // The warp's tile: its dy rows go to shared memory asynchronously (lane: pixel lane /
    // kLanes + kPixels * i, channels (lane % kLanes) * 8 .. + 7; zeros for a missing pixel), in
    // flight during the staging. Pixel q is stored as row k = 2 * (q % 8) + q / 8, in the
    // reduction's order, so that ldmatrix's 8 rows are neighbours (pixels p and p + 8 rows
    // apart would share banks).
    const FwdTile own[1] = {LocateTile(g, t0 + warp, end)};
#pragma unroll
    for (int i = 0; i < kTilePixels / kPixels; ++i) {
      const int q = lane / kLanes + kPixels * i, c = (lane % kLanes) * 8;
      const bool in = q < own[0].pixels;
      CpAsync16(d + (warp * kTilePixels + 2 * (q % 8) + q / 8) * ldd + c,
                in ? dy + (own[0].first + q) * g.k + k0 + c : dy, in);
    }
    CpAsyncCommit();
    StageWindows<1, 3>(g, v, {1, 8 * v.sc, lay.words}, x, own, lane,
                       [&](int, int r, int i, uint32_t word) { mine[r * lay.words + i] = word; });
    CpAsyncWait<0>();
    __syncthreads();
#pragma unroll 1
    for (int j = 0; j < kWgTiles; ++j) {
      uint32_t bf[kNt][2];
      const uint16_t* d_lane = d + (j * kTilePixels + lane % 16) * ldd + wn * (kK / 2);
      if constexpr (kNt == 1) {
        // Matrices 0, 1: k rows 0-7 and 8-15 of the warp's one n-tile.
        LdMatrixX2Trans(bf[0], d_lane);
      } else {
#pragma unroll
        for (int nt = 0; nt < kNt; nt += 2) {
          // Matrices 0, 1: k rows 0-7 and 8-15 of n-tile nt; 2, 3: of n-tile nt + 1.
          uint32_t r[4];
          LdMatrixX4Trans(r, d_lane + nt * 8 + (lane / 16) * 8);
          bf[nt][0] = r[0], bf[nt][1] = r[1], bf[nt + 1][0] = r[2], bf[nt + 1][1] = r[3];
        }
      }
      // The tile's window, the same for the whole warp: a base plus each lane's offsets.
      const char* w = reinterpret_cast<const char*>(windows + j * lay.tile);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t af[4];
#pragma unroll
        for (int f = 0; f < 4; ++f) af[f] = *reinterpret_cast<const uint32_t*>(w + a_at[mt][f]);
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) MmaBf16(acc[mt][nt], af, bf[nt][0], bf[nt][1]);
      }
    }
    __syncthreads();
  }
  float* out = part + static_cast<int64_t>(blockIdx.x) * g.k * g.patch;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int u = 2 * (wm * MT + mt) + h, j = u % v.hr * 8 + qr;
      if (u >= runs || j >= seg) continue;
      const int e = u / v.hr * seg + j;  // the weight's place in a filter: (r * S + s) * C + c
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const int k = k0 + wn * (kK / 2) + nt * 8 + qc;
        out[static_cast<int64_t>(k) * g.patch + e] = acc[mt][nt][2 * h];
        out[static_cast<int64_t>(k + 1) * g.patch + e] = acc[mt][nt][2 * h + 1];
      }
    }
  }
}

size_t ForwardSmem(const Geometry& g, const Halves& v) {
  return (static_cast<size_t>(g.tile_k) * v.ldb + static_cast<size_t>(kFwdWarps) * WarpArea(g, v)) *
         sizeof(uint16_t);
}
size_t WgradSmem(const Geometry& g, const Halves& v) {
  return static_cast<size_t>(kWgTiles) * (kTilePixels * (g.tile_k + 8) * sizeof(uint16_t) +
                                          MakeWgradLayout(g, v).tile * sizeof(uint32_t));
}

// Blocks along the pixels for `per_wave` resident blocks over the channel tiles: one wave
// (the kernels walk their share of the pixels), never more than there is work for.
int64_t OneWave(const Geometry& g, int64_t units, int sm_count, int resident) {
  const int64_t wave =
      std::max<int64_t>(1, int64_t{std::max(sm_count, 1)} * resident / (g.k / g.tile_k));
  return std::min(units, wave);
}

// A backward filter kernel and the call that lets it take more than 48 KB of shared memory
// (made before its occupancy is asked, so that the split is the same at plan time and launch).
struct WgradKernel {
  const void* kernel;
  cudaError_t (*allow)(int bytes);
};

template <int kK, int MT>
WgradKernel WgradOf() {
  return {reinterpret_cast<const void*>(StemBackwardFilterKernel<kK, MT>),
          &AllowDynamicSmem<StemBackwardFilterKernel<kK, MT>>};
}

// The kernel for the block's channels and the m16 tiles of dw^T per warp: a quarter of them
// (MT 1 to 4).
WgradKernel WgradKernelFor(const Geometry& g, const Halves& v) {
  static const WgradKernel kernels[2][4] = {
      {WgradOf<kNarrowK, 1>(), WgradOf<kNarrowK, 2>(), WgradOf<kNarrowK, 3>(),
       WgradOf<kNarrowK, 4>()},
      {WgradOf<kWideK, 1>(), WgradOf<kWideK, 2>(), WgradOf<kWideK, 3>(), WgradOf<kWideK, 4>()}};
  const int mtiles = v.count / 2;
  return kernels[g.tile_k == kWideK][std::clamp((mtiles + 3) / 4, 1, 4) - 1];
}

// The backward filter's blocks along the tiles and the tiles each walks, in whole stages: one
// wave of resident blocks.
struct WgradSplit {
  int blocks;
  unsigned per_block;
};
WgradSplit SplitTiles(const Geometry& g, const Halves& v, int sm_count) {
  const int64_t tiles = FwdTiles(g);
  const int64_t stages = (tiles + kWgTiles - 1) / kWgTiles;
  const WgradKernel k = WgradKernelFor(g, v);
  const int smem = static_cast<int>(WgradSmem(g, v));
  const int resident =
      k.allow(smem) == cudaSuccess ? ResidentBlocksOf(k.kernel, kWgThreads, smem) : 1;
  const int64_t want = OneWave(g, stages, sm_count, resident);
  const int64_t per_block = (stages + want - 1) / want * kWgTiles;
  return {static_cast<int>((tiles + per_block - 1) / per_block), static_cast<unsigned>(per_block)};
}

}  // namespace

bool StemConvSupported(const ConvShape& shape, int pass) {
  if (!CheckConvShape(shape).ok() || shape.c < 1 || shape.c > kMaxChannels ||
      shape.k % kNarrowK != 0 || shape.s * shape.c > kMaxSegment) {
    return false;
  }
  if (pass != 0 && pass != 2) return false;
  // Both passes walk the forward's tiles and stage their windows: tiles and image offsets in
  // 32 bits, at most 32 runs of 8 values.
  const Halves v = MakeHalves(shape);
  const Geometry g = MakeGeometry(shape);
  constexpr int64_t kMax32 = std::numeric_limits<int>::max();
  const size_t smem = pass == 0 ? ForwardSmem(g, v) : WgradSmem(g, v);
  return v.count * 8 <= kMaxRow && smem <= kMaxSmem &&
         FwdTiles(g) + kWarpTiles * kFwdWarps <= kMax32 &&
         static_cast<int64_t>(shape.n) * shape.h * shape.w * shape.c < kMax32;
}

size_t StemConvWorkspaceBytes(const ConvShape& shape, int pass, int sm_count) {
  if (pass != 2 || !StemConvSupported(shape, pass)) return 0;
  const Geometry g = MakeGeometry(shape);
  return static_cast<size_t>(SplitTiles(g, MakeHalves(shape), sm_count).blocks) * g.k * g.patch *
         sizeof(float);
}

absl::Status StemConvForwardCuda(const ConvShape& shape, const Bf16* x, const Bf16* w, Bf16* y,
                                 const CudaContext& ctx) {
  if (!StemConvSupported(shape, 0)) {
    return absl::InvalidArgumentError("stem conv forward: shape not supported");
  }
  if (!Aligned16(y)) return absl::InvalidArgumentError("stem conv forward: y not 16-byte aligned");
  const Geometry g = MakeGeometry(shape);
  const Halves v = MakeHalves(shape);
  const int smem = static_cast<int>(ForwardSmem(g, v));
  const int64_t tiles = FwdTiles(g);
  const int64_t blocks_needed = (tiles + kWarpTiles * kFwdWarps - 1) / (kWarpTiles * kFwdWarps);
  auto launch = [&](auto kernel_tag) {
    constexpr auto kernel = decltype(kernel_tag)::kKernel;
    AllowDynamicSmem<kernel>(smem);
    const int64_t blocks =
        OneWave(g, blocks_needed, ctx.sm_count,
                ResidentBlocksOf(reinterpret_cast<const void*>(kernel), kBlockThreads, smem));
    kernel<<<dim3(static_cast<unsigned>(blocks), g.k / g.tile_k), kBlockThreads, smem,
             ctx.stream>>>(g, v, reinterpret_cast<const uint16_t*>(x),
                           reinterpret_cast<const uint16_t*>(w),
                           reinterpret_cast<__nv_bfloat16*>(y));
  };
  const bool even = v.sc % 2 == 0;
  if (g.tile_k == kWideK) {
    even ? launch(KernelTag<StemForwardKernel<kWideK, true>>{})
         : launch(KernelTag<StemForwardKernel<kWideK, false>>{});
  } else {
    even ? launch(KernelTag<StemForwardKernel<kNarrowK, true>>{})
         : launch(KernelTag<StemForwardKernel<kNarrowK, false>>{});
  }
  return LaunchStatus("stem conv forward");
}

absl::Status StemConvBackwardFilterCuda(const ConvShape& shape, const Bf16* x, const Bf16* dy,
                                        Bf16* dw, void* workspace, const CudaContext& ctx) {
  if (!StemConvSupported(shape, 2)) {
    return absl::InvalidArgumentError("stem conv backward filter: shape not supported");
  }
  if (reinterpret_cast<uintptr_t>(dy) % 16 != 0) {
    return absl::InvalidArgumentError("stem conv backward filter: dy not 16-byte aligned");
  }
  Geometry g = MakeGeometry(shape);
  Halves v = MakeHalves(shape);
  WgradLayout lay = MakeWgradLayout(g, v);
  const WgradSplit split = SplitTiles(g, v, ctx.sm_count);  // allows the kernel's shared memory
  const auto* xs = reinterpret_cast<const uint16_t*>(x);
  const auto* dys = reinterpret_cast<const uint16_t*>(dy);
  auto* part = static_cast<float*>(workspace);
  const void* kernel = WgradKernelFor(g, v).kernel;
  const int smem = static_cast<int>(WgradSmem(g, v));
  unsigned per_block = split.per_block;
  void* args[] = {&g, &v, &lay, &xs, &dys, &per_block, &part};
  TOPIARY_RETURN_IF_ERROR(CudaStatus(cudaLaunchKernel(kernel, dim3(split.blocks, g.k / g.tile_k),
                                                      dim3(kWgThreads), args, smem, ctx.stream),
                                     "stem conv backward filter"));
  TOPIARY_RETURN_IF_ERROR(LaunchStatus("stem conv backward filter"));
  const int64_t count = static_cast<int64_t>(g.k) * g.patch;
  SumPartsKernel<<<SumPartsBlocks(count), kSumPartsThreads, 0, ctx.stream>>>(split.blocks, count,
                                                                             part, dw);
  return LaunchStatus("stem conv backward filter sums");
}

}  // namespace topiary::kernels
