// bf16 convolutions of images with few channels on tensor cores (see stem_conv.h).
//
// Forward: a block owns 64 output channels, with the filters in shared memory once; each of its
// warps walks units of two tiles of 16 output pixels of one output row (persistent, one wave of
// resident blocks), stages the tiles' input windows in its own area of shared memory and reads
// the A fragments straight from them (StemForwardKernel says how), multiplying with
// mma.sync.m16n8k16 (fp32 sums) and storing bf16 rows through the same area in 16-byte vectors.
//
// Backward filter: dw^T [kr][K] = im2col^T dy, summed over the output pixels. A block owns 64
// output channels and a fixed range of pixels (one wave of resident blocks), walked 64 at a time:
// its threads gather the pixels' receptive fields transposed (A^T [kr][64], a pixel per thread, so
// that neighbouring threads write neighbouring halves) and copy dy [64 pixels][64 channels] in
// 16-byte vectors; four warps (2 x 2) multiply with mma.sync, reading dy's fragments transposed
// with ldmatrix.trans. The blocks' fp32 sums go to the workspace, and a second kernel adds them per
// weight in block order: the same bits on every run.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_format.h"
#include "kernels/conv/stem_conv.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

constexpr int kTileK = 64;       // output channels per block
constexpr int kTilePixels = 16;  // output pixels of a forward tile: one m16 tile of one row
constexpr int kWarpTiles = 2;    // forward tiles a warp multiplies together
constexpr int kFwdWarps = 4;
constexpr int kWgPixels = 64;  // output pixels per backward-filter stage
constexpr int kBlockThreads = 128;
constexpr int kMaxFwdSmem = 96 * 1024;  // at least two forward blocks per multiprocessor
constexpr int kMaxChannels = 4;
constexpr int kMaxRow = 256;     // the longest receptive field, rounded up to 32
constexpr int kMaxSegment = 32;  // the most values of one filter row (S * C)

int RoundUp32(int v) { return (v + 31) / 32 * 32; }

struct Geometry {
  int h, w, c, k, r, s, stride_h, stride_w, pad_h, pad_w, ho, wo;
  int64_t pixels;  // N * Ho * Wo
  int64_t rows;    // N * Ho
  int patch;       // R * S * C
  int kr;          // patch rounded up to 32: the backward filter's rows of im2col^T
};

Geometry MakeGeometry(const ConvShape& s) {
  Geometry g;
  g.h = s.h, g.w = s.w, g.c = s.c, g.k = s.k, g.r = s.r, g.s = s.s;
  g.stride_h = s.stride_h, g.stride_w = s.stride_w, g.pad_h = s.pad_h, g.pad_w = s.pad_w;
  g.ho = s.ho(), g.wo = s.wo();
  g.rows = static_cast<int64_t>(s.n) * g.ho;
  g.pixels = g.rows * g.wo;
  g.patch = s.patch();
  g.kr = RoundUp32(g.patch);
  return g;
}

__device__ __forceinline__ uint32_t Lds32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// d += a b on one m16n8k16 tile: bf16 operands in the PTX fragment layouts, fp32 sums.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragment of the 16 x 16 tile at `p` (its row 0, column 0) of a row-major bf16 matrix
// with rows `ld` elements apart; qr and qc are the lane's row and column pair in the tile.
__device__ __forceinline__ void LoadA(const uint16_t* p, int ld, int qr, int qc, uint32_t (&a)[4]) {
  const uint16_t* q = p + qr * ld + qc;
  a[0] = Lds32(q);
  a[1] = Lds32(q + 8 * ld);
  a[2] = Lds32(q + 8);
  a[3] = Lds32(q + 8 * ld + 8);
}

// Output pixel pix's receptive field, filter rows [r_begin, r_end), into out[j * step], column
// j = (r * S + s) * C + c: the input's bits, zeros outside the image, and zeros throughout
// where the pixel is not the caller's (valid false). A filter row's S * C values are contiguous
// in x and in the row of A, so each is a run of loads at fixed offsets from one address, and
// the image's edges are one range of them [e_lo, e_hi) per pixel (no division per value). The
// loads of kRows filter rows are issued before their stores: the gather waits on memory once
// per kRows rows, not once per value.
template <int kRows>
__device__ void GatherRows(const Geometry& g, const uint16_t* __restrict__ x, int64_t pix,
                           bool valid, int r_begin, int r_end, uint16_t* out, int step) {
  int n = 0, h0 = 0, w0 = 0;
  if (valid) {
    const int64_t t = pix / g.wo;
    w0 = static_cast<int>(pix - t * g.wo) * g.stride_w - g.pad_w;
    h0 = static_cast<int>(t % g.ho) * g.stride_h - g.pad_h;
    n = static_cast<int>(t / g.ho);
  }
  const auto* image =
      reinterpret_cast<const unsigned short*>(x) + static_cast<int64_t>(n) * g.h * g.w * g.c;
  const int seg = g.s * g.c;
  const int e_lo = max(0, -w0) * g.c, e_hi = min(g.s, g.w - w0) * g.c;
  for (int r0 = r_begin; r0 < r_end; r0 += kRows) {
    uint16_t v[kRows][kMaxSegment];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int h = h0 + r0 + i;
      const bool row_in = valid && r0 + i < r_end && h >= 0 && h < g.h;
      // The run's first value's offset (w0 may be negative: only offsets in [e_lo, e_hi) load).
      const int64_t base = (static_cast<int64_t>(row_in ? h : 0) * g.w + w0) * g.c;
#pragma unroll
      for (int e = 0; e < kMaxSegment; ++e) {
        v[i][e] = row_in && e >= e_lo && e < e_hi ? __ldg(image + base + e) : uint16_t{0};
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (r0 + i >= r_end) break;
      uint16_t* dst = out + (r0 + i) * seg * step;
#pragma unroll
      for (int e = 0; e < kMaxSegment; ++e) {
        if (e < seg) dst[e * step] = v[i][e];
      }
    }
  }
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
// [kWarpTiles * 16 pixels][kTileK + 8] that reuses it after the multiply (rounded to 8: every
// area starts 16-byte aligned).
__host__ __device__ int WarpArea(const Geometry& g, const Halves& v) {
  const int windows = kWarpTiles * g.r * v.lr;
  const int out = kWarpTiles * kTilePixels * (kTileK + 8);
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

// Four 8x8 bf16 matrices from shared memory: lanes 8i..8i+7 give matrix i's rows.
__device__ __forceinline__ void LdMatrixX4(const uint16_t* row, uint32_t (&r)[4]) {
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
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

// The warp's tiles' windows: row r of a tile's window holds input row ho * stride - pad + r
// from element column (wo0 * stride - pad) * C on, lr values (zeros outside the image), so that
// pixel p's field of that filter row starts at p * sc. A lane takes the pairs of values at
// word i = lane and lane + 32 of kStageRows rows of every tile (coalesced loads, one 4-byte
// store each) and issues all their loads before it stores them: the warp waits on memory once
// per kStageRows rows. The columns' image edges are tested once for all rows.
constexpr int kStageRows = 4;

__device__ void StageWindows(const Geometry& g, const Halves& v, const uint16_t* __restrict__ x,
                             const FwdTile (&tile)[kWarpTiles], uint16_t* area, int lane) {
  const int row_values = g.w * g.c;
  const int lw = v.lr / 2, words = g.r * lw;  // 4-byte words of a window row and a window
  auto* out = reinterpret_cast<uint32_t*>(area);
  for (int i0 = 0; i0 < lw; i0 += 64) {
    bool lo_ok[kWarpTiles][2], hi_ok[kWarpTiles][2];
    int e[kWarpTiles][2];
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
      const int col0 = (tile[t].wo0 * g.stride_w - g.pad_w) * g.c;
#pragma unroll
      for (int sl = 0; sl < 2; ++sl) {
        const int i = i0 + lane + 32 * sl;
        e[t][sl] = col0 + 2 * i;
        lo_ok[t][sl] = i < lw && e[t][sl] >= 0 && e[t][sl] < row_values;
        hi_ok[t][sl] = i < lw && e[t][sl] + 1 >= 0 && e[t][sl] + 1 < row_values;
      }
    }
    for (int r0 = 0; r0 < g.r; r0 += kStageRows) {
      uint32_t val[kStageRows][kWarpTiles][2];
#pragma unroll
      for (int rr = 0; rr < kStageRows; ++rr) {
#pragma unroll
        for (int t = 0; t < kWarpTiles; ++t) {
          const int h = tile[t].ho * g.stride_h - g.pad_h + r0 + rr;
          const bool in = r0 + rr < g.r && tile[t].pixels > 0 && h >= 0 && h < g.h;
          // 32-bit offsets (StemConvSupported: the image has fewer than 2^31 values), so that a
          // load's address is one multiply-add from x.
          const int row = (tile[t].n * g.h + (in ? h : 0)) * row_values;
#pragma unroll
          for (int sl = 0; sl < 2; ++sl) {
            const uint16_t* p = x + (row + e[t][sl]);
            const uint32_t lo = in && lo_ok[t][sl] ? __ldg(p) : 0u;
            const uint32_t hi = in && hi_ok[t][sl] ? __ldg(p + 1) : 0u;
            val[rr][t][sl] = lo | hi << 16;
          }
        }
      }
#pragma unroll
      for (int rr = 0; rr < kStageRows; ++rr) {
        if (r0 + rr >= g.r) break;
#pragma unroll
        for (int sl = 0; sl < 2; ++sl) {
          const int i = i0 + lane + 32 * sl;
          if (i >= lw) continue;
#pragma unroll
          for (int t = 0; t < kWarpTiles; ++t) out[t * words + (r0 + rr) * lw + i] = val[rr][t][sl];
        }
      }
    }
  }
}

// Forward: each warp walks units of kWarpTiles tiles (16 output pixels of one output row each)
// for the block's 64 output channels. It stages the tiles' windows (StageWindows) in its own
// area of shared memory and reads the A fragments straight from them: pixel p's values of half h
// are window row h / hr at p * sc + (h % hr) * 8, no im2col. The filters are in shared memory
// once per block, in the halves' order, read with ldmatrix. The fp32 sums go out through the
// same area as bf16 rows of 64 channels, in 16-byte stores. kEven: sc is even, so every pair a
// fragment register takes is 4-byte aligned.
template <bool kEven>
__global__ void __launch_bounds__(kBlockThreads, 4)
    StemForwardKernel(Geometry g, Halves v, const uint16_t* __restrict__ x,
                      const uint16_t* __restrict__ w, __nv_bfloat16* __restrict__ y) {
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* b = smem;  // [kTileK][ldb]: the filters, by halves
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, qr = lane / 4, qc = (lane % 4) * 2;
  uint16_t* area = smem + kTileK * v.ldb + warp * WarpArea(g, v);
  const int k0 = blockIdx.y * kTileK;
  const int seg = g.s * g.c;
  for (int i = t; i < kTileK * v.count * 8; i += kBlockThreads) {
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
    StageWindows(g, v, x, tile, area, lane);
    __syncwarp();
    float acc[kWarpTiles][8][4] = {};
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
      uint32_t bf[8][2];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        // Matrices 0, 1: filters 16q..16q+7, the step's two halves; 2, 3: filters 16q+8..16q+15.
        uint32_t m[4];
        LdMatrixX4(b_lane + q * 16 * v.ldb + step * 16, m);
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
        for (int nt = 0; nt < 8; ++nt) Mma(acc[i][nt], a, bf[nt][0], bf[nt][1]);
      }
    }
    __syncwarp();  // every lane has read the windows before the sums overwrite them
    constexpr int ldo = (kTileK + 8) / 2;  // words per staged pixel: 16 + 128 bytes
    auto* out = reinterpret_cast<uint32_t*>(area);
#pragma unroll
    for (int i = 0; i < kWarpTiles; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int p = i * kTilePixels + half * 8 + qr;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const __nv_bfloat162 o =
              __floats2bfloat162_rn(acc[i][nt][2 * half], acc[i][nt][2 * half + 1]);
          out[p * ldo + nt * 4 + qc / 2] = *reinterpret_cast<const uint32_t*>(&o);
        }
      }
    }
    __syncwarp();
    // 8 lanes per pixel, 16 bytes each: a warp stores four pixels' 64 channels at a time.
#pragma unroll
    for (int it = 0; it < kWarpTiles * kTilePixels / 4; ++it) {
      const int i = it * 4 / kTilePixels, q = it * 4 % kTilePixels + lane / 8, p = i * 16 + q;
      if (q < tile[i].pixels) {
        *reinterpret_cast<uint4*>(y + (tile[i].first + q) * g.k + k0 + (lane % 8) * 8) =
            *reinterpret_cast<const uint4*>(out + p * ldo + (lane % 8) * 4);
      }
    }
    __syncwarp();  // the stores have read the area before the next unit's windows
  }
}

// Four 8x8 bf16 matrices from shared memory, transposed: lanes 8i..8i+7 give matrix i's rows.
__device__ __forceinline__ void LdMatrixX4Trans(const uint16_t* row, uint32_t (&r)[4]) {
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

// MT: 16-row tiles of dw^T per warp (two warps share the kr = 32 MT rows).
template <int MT>
__global__ void __launch_bounds__(kBlockThreads)
    StemBackwardFilterKernel(Geometry g, const uint16_t* __restrict__ x,
                             const uint16_t* __restrict__ dy, int64_t per_block,
                             float* __restrict__ part) {
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr int lda = kWgPixels + 8;  // 36 words: 8 rows x 4 lanes in 32 banks
  constexpr int ldd = kTileK + 8;     // 144 bytes: ldmatrix's 8 rows in distinct banks
  uint16_t* at = smem;                // [kr][lda]: im2col^T of the stage's pixels
  uint16_t* d = smem + g.kr * lda;    // [kWgPixels][ldd]: their output gradients
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, qr = lane / 4, qc = (lane % 4) * 2;
  const int wm = warp / 2, wn = warp % 2;
  const int k0 = blockIdx.y * kTileK;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * per_block;
  const int64_t end = begin + per_block < g.pixels ? begin + per_block : g.pixels;
  for (int i = t; i < (g.kr - g.patch) * kWgPixels; i += kBlockThreads) {
    at[(g.patch + i / kWgPixels) * lda + i % kWgPixels] = 0;  // past the patch: zero throughout
  }
  const int half = (g.r + 1) / 2;  // the first half of the threads gathers the first filter rows
  const int px = t % kWgPixels;
  const bool first = t < kWgPixels;
  float acc[MT][4][4] = {};
  for (int64_t p0 = begin; p0 < end; p0 += kWgPixels) {
    // dy's loads first, in flight during the gather.
    constexpr int kVecs = kWgPixels * (kTileK / 8) / kBlockThreads;
    uint4 dv[kVecs];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int i = t + v * kBlockThreads, r = i / (kTileK / 8), c8 = i % (kTileK / 8);
      dv[v] = p0 + r < end ? *reinterpret_cast<const uint4*>(dy + (p0 + r) * g.k + k0 + c8 * 8)
                           : make_uint4(0, 0, 0, 0);
    }
    GatherRows<1>(g, x, p0 + px, p0 + px < end, first ? 0 : half, first ? half : g.r, at + px, lda);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int i = t + v * kBlockThreads, r = i / (kTileK / 8), c8 = i % (kTileK / 8);
      *reinterpret_cast<uint4*>(d + r * ldd + c8 * 8) = dv[v];
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kWgPixels; kk += 16) {
      uint32_t bf[4][2];
#pragma unroll
      for (int nt = 0; nt < 4; nt += 2) {
        // Matrices 0, 1: pixels kk..kk+7 and kk+8..kk+15 of n-tile nt; 2, 3: of n-tile nt + 1.
        uint32_t r[4];
        LdMatrixX4Trans(d + (kk + lane % 16) * ldd + wn * 32 + nt * 8 + (lane / 16) * 8, r);
        bf[nt][0] = r[0], bf[nt][1] = r[1], bf[nt + 1][0] = r[2], bf[nt + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t af[4];
        LoadA(at + (wm * MT * 16 + mt * 16) * lda + kk, lda, qr, qc, af);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) Mma(acc[mt][nt], af, bf[nt][0], bf[nt][1]);
      }
    }
    __syncthreads();
  }
  float* out = part + static_cast<int64_t>(blockIdx.x) * g.k * g.patch;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = wm * MT * 16 + mt * 16 + h * 8 + qr;
      if (j >= g.patch) continue;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int k = k0 + wn * 32 + nt * 8 + qc;
        out[static_cast<int64_t>(k) * g.patch + j] = acc[mt][nt][2 * h];
        out[static_cast<int64_t>(k + 1) * g.patch + j] = acc[mt][nt][2 * h + 1];
      }
    }
  }
}

// dw[e] = the blocks' part[b][e] added in block order (32 weights x 32 lanes of blocks per
// block: coalesced reads; each lane adds every 32nd block, then the lanes in order).
__global__ void __launch_bounds__(1024)
    SumPartsKernel(int blocks, int64_t count, const float* __restrict__ part,
                   __nv_bfloat16* __restrict__ dw) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (e < count) {
#pragma unroll 4
    for (int b = threadIdx.y; b < blocks; b += 32) s += part[b * count + e];
  }
  __shared__ float lanes[32][33];
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || e >= count) return;
  float total = 0.0f;
  for (int l = 0; l < 32; ++l) total += lanes[l][threadIdx.x];
  dw[e] = __float2bfloat16_rn(total);
}

size_t ForwardSmem(const Geometry& g, const Halves& v) {
  return (static_cast<size_t>(kTileK) * v.ldb + static_cast<size_t>(kFwdWarps) * WarpArea(g, v)) *
         sizeof(uint16_t);
}
size_t WgradSmem(const Geometry& g) {
  return (static_cast<size_t>(g.kr) * (kWgPixels + 8) + kWgPixels * (kTileK + 8)) *
         sizeof(uint16_t);
}

// Blocks along the pixels for `per_wave` resident blocks over the channel tiles: one wave
// (the kernels walk their share of the pixels), never more than there is work for.
int64_t OneWave(const Geometry& g, int64_t units, int sm_count, int resident) {
  const int64_t wave =
      std::max<int64_t>(1, int64_t{std::max(sm_count, 1)} * resident / (g.k / kTileK));
  return std::min(units, wave);
}

const void* WgradKernel(int mt);

// The backward filter's blocks along the pixels and the pixels each walks, in whole 64-pixel
// stages: one wave of resident blocks.
struct WgradSplit {
  int blocks;
  int64_t per_block;
};
WgradSplit SplitPixels(const Geometry& g, int sm_count) {
  const int64_t stages = (g.pixels + kWgPixels - 1) / kWgPixels;
  const int64_t want = OneWave(
      g, stages, sm_count, ResidentBlocksOf(WgradKernel(g.kr / 32), kBlockThreads, WgradSmem(g)));
  const int64_t per_block = (stages + want - 1) / want * kWgPixels;
  return {static_cast<int>((g.pixels + per_block - 1) / per_block), per_block};
}

// The backward filter kernel for rows of 32 mt values (mt 1 to 8).
const void* WgradKernel(int mt) {
  static const void* const kernels[] = {reinterpret_cast<const void*>(StemBackwardFilterKernel<1>),
                                        reinterpret_cast<const void*>(StemBackwardFilterKernel<2>),
                                        reinterpret_cast<const void*>(StemBackwardFilterKernel<3>),
                                        reinterpret_cast<const void*>(StemBackwardFilterKernel<4>),
                                        reinterpret_cast<const void*>(StemBackwardFilterKernel<5>),
                                        reinterpret_cast<const void*>(StemBackwardFilterKernel<6>),
                                        reinterpret_cast<const void*>(StemBackwardFilterKernel<7>),
                                        reinterpret_cast<const void*>(StemBackwardFilterKernel<8>)};
  return kernels[std::clamp(mt, 1, 8) - 1];
}

}  // namespace

bool StemConvSupported(const ConvShape& shape, int pass) {
  if (!CheckConvShape(shape).ok() || shape.c < 1 || shape.c > kMaxChannels ||
      shape.k % kTileK != 0 || shape.s * shape.c > kMaxSegment) {
    return false;
  }
  if (pass == 0) {
    const Halves v = MakeHalves(shape);
    const Geometry g = MakeGeometry(shape);
    constexpr int64_t kMax32 = std::numeric_limits<int>::max();
    return v.count * 8 <= kMaxRow && ForwardSmem(g, v) <= kMaxFwdSmem &&
           FwdTiles(g) + kWarpTiles * kFwdWarps <= kMax32 &&
           static_cast<int64_t>(shape.n) * shape.h * shape.w * shape.c < kMax32;
  }
  return pass == 2 && RoundUp32(shape.patch()) <= kMaxRow;
}

size_t StemConvWorkspaceBytes(const ConvShape& shape, int pass, int sm_count) {
  if (pass != 2 || !StemConvSupported(shape, pass)) return 0;
  const Geometry g = MakeGeometry(shape);
  return static_cast<size_t>(SplitPixels(g, sm_count).blocks) * g.k * g.patch * sizeof(float);
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
    kernel<<<dim3(static_cast<unsigned>(blocks), g.k / kTileK), kBlockThreads, smem, ctx.stream>>>(
        g, v, reinterpret_cast<const uint16_t*>(x), reinterpret_cast<const uint16_t*>(w),
        reinterpret_cast<__nv_bfloat16*>(y));
  };
  if (v.sc % 2 == 0) {
    launch(KernelTag<StemForwardKernel<true>>{});
  } else {
    launch(KernelTag<StemForwardKernel<false>>{});
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
  const Geometry g = MakeGeometry(shape);
  const WgradSplit split = SplitPixels(g, ctx.sm_count);
  const auto* xs = reinterpret_cast<const uint16_t*>(x);
  const auto* dys = reinterpret_cast<const uint16_t*>(dy);
  auto* part = static_cast<float*>(workspace);
  const void* kernel = WgradKernel(g.kr / 32);
  const int smem = static_cast<int>(WgradSmem(g));
  // At most 256 rows of 72 values and 64 x 72 more: under the 48 KB a launch may take
  // without raising the kernel's limit.
  static_assert((kMaxRow * (kWgPixels + 8) + kWgPixels * (kTileK + 8)) * sizeof(uint16_t) <=
                48 * 1024);
  Geometry arg = g;
  int64_t per_block = split.per_block;
  void* args[] = {&arg, &xs, &dys, &per_block, &part};
  TOPIARY_RETURN_IF_ERROR(CudaStatus(cudaLaunchKernel(kernel, dim3(split.blocks, g.k / kTileK),
                                                      dim3(kBlockThreads), args, smem, ctx.stream),
                                     "stem conv backward filter"));
  TOPIARY_RETURN_IF_ERROR(LaunchStatus("stem conv backward filter"));
  const int64_t count = static_cast<int64_t>(g.k) * g.patch;
  SumPartsKernel<<<static_cast<unsigned>((count + 31) / 32), dim3(32, 32), 0, ctx.stream>>>(
      split.blocks, count, part, reinterpret_cast<__nv_bfloat16*>(dw));
  return LaunchStatus("stem conv backward filter sums");
}

}  // namespace topiary::kernels
