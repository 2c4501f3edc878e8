// Direct fp32 convolutions for small channel counts (see direct_conv.h).
//
// Forward: a block owns a tile of up to 128 output pixels of one image and KT output channels.
// It stages, 16 input channels at a time, the tile's input window (zeros in the padding) and
// the filter chunk in shared memory; each thread accumulates 4 pixels x 8 output channels in
// registers, reading per tap and 4 channels four float4s of input and eight of filter for 128
// FMAs. A thread's 4 pixels are spread over the tile (pg, pg + tile/4, ...) so that the
// neighbouring threads of a warp read neighbouring pixels, which kPixStride puts in different
// banks; the filter chunk is stored [tap][c][half][kg][4] so that the 8-channel groups of a
// warp read consecutive float4s.
//
// Backward data (stride 1) is the forward kernel on dy with the filter transposed and flipped
// (pad R-1-pad). Backward filter: a block owns KT output channels, 16 input channels and all
// taps, and walks a fixed set of output tiles, staging each tile's input window and output
// gradients; a team of threads covers the block's outputs (8 output channels x 4 input
// channels of one tap each) and replicated teams split the tile's pixels. The blocks' partial
// filters go to the workspace and one more kernel adds them in a fixed order: the same bits
// on every run.
#include <cuda_bf16.h>

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "kernels/conv/direct_conv.h"
#include "kernels/conv/split_sums.cuh"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "kernels/runtime/fast_divmod.h"
#include "kernels/runtime/warp_mma.cuh"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

constexpr int kChunk = 16;              // reduced channels staged per round
constexpr int kPixStride = kChunk + 4;  // floats per staged pixel (bank spread)
constexpr int kPx = 4;                  // output pixels per thread (forward)
constexpr int kTilePixels = 128;        // output pixels per block (forward)
constexpr int kMaxChannels = 128;
constexpr int kMaxSmemBytes = 200 * 1024;

struct FwdTile {
  int th = 0, tw = 0;            // output rows and columns per block
  int rows_in = 0, cols_in = 0;  // the staged input window
  int ksplit = 1;                // thread teams per block, each reducing its own channel chunks
  // Divisions by the tile's fixed numbers as multiplies (fast_divmod.h): by tw, by cols_in, by
  // the window's pixels, by the tiles across the map, by the filter's taps.
  FastDivmod tw_div, cols_div, window_div, tiles_w_div, taps_div;
};

// Thread teams per block: doubled while the block stays within 256 threads, the teams share
// the 16-channel chunks evenly and their staged copies (`replica_floats` each) fit in shared
// memory.
int TeamSplit(const ConvShape& s, int team_threads, int replica_floats) {
  const int chunks = s.c / kChunk;
  int split = 1;
  while (split * 2 * team_threads <= 256 && chunks % (split * 2) == 0 &&
         split * 2 * replica_floats * 4 <= kMaxSmemBytes) {
    split *= 2;
  }
  return split;
}

// A block's output tile (and, for the forward kernel, its channel split: a block of few
// threads gets more teams, each summing every ksplit-th chunk of 16 input channels, so that
// small maps still give the SMs enough warps).
FwdTile ChooseTile(const ConvShape& s, int kt = 0) {
  FwdTile t;
  const int wo = s.wo();
  t.tw = wo >= 32 ? 32 : wo >= 16 ? 16 : 8;  // narrower maps leave columns idle
  t.th = std::min(kTilePixels / t.tw, s.ho());
  t.rows_in = (t.th - 1) * s.stride_h + s.r;
  t.cols_in = (t.tw - 1) * s.stride_w + s.s;
  t.tw_div = FastDivmod(t.tw);
  t.cols_div = FastDivmod(t.cols_in);
  t.window_div = FastDivmod(t.rows_in * t.cols_in);
  t.tiles_w_div = FastDivmod((wo + t.tw - 1) / t.tw);
  t.taps_div = FastDivmod(s.r * s.s);
  if (kt > 0) {
    const int team = t.th * t.tw / kPx * (kt / 8);
    t.ksplit = TeamSplit(s, team, t.rows_in * t.cols_in * kPixStride + s.r * s.s * kChunk * kt);
  }
  return t;
}

// The widest output-channel tile (8 channels per thread group) that divides k.
int ChooseKt(int k) { return k % 64 == 0 ? 64 : k % 32 == 0 ? 32 : k % 16 == 0 ? 16 : 8; }

__device__ __forceinline__ float Lane(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ void Fma8(float (&acc)[8], float a, const float4& lo, const float4& hi) {
  acc[0] += a * lo.x, acc[1] += a * lo.y, acc[2] += a * lo.z, acc[3] += a * lo.w;
  acc[4] += a * hi.x, acc[5] += a * hi.y, acc[6] += a * hi.z, acc[7] += a * hi.w;
}

// Rounds to TF32 (10-bit mantissa), to nearest, ties away: cuDNN's TF32 rounding.
__device__ __forceinline__ float RoundTf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
  return __uint_as_float(r);
}

// A tile pixel's staged window offset, with `stride` values per staged pixel.
__device__ __forceinline__ int StagedPixel(const ConvShape& s, const FwdTile& t, int pix,
                                           int stride) {
  int row;
  const int col = t.tw_div.Mod(pix, &row);
  return (row * s.stride_h * t.cols_in + col * s.stride_w) * stride;
}

// Stages `chunks` consecutive 16-channel chunks, from channel c0, of the input window whose
// top-left pixel is (h0, w0) of image xn: [chunk][pixel][kPixStride], zeros in the padding,
// each value rounded to TF32 when kTf32.
template <bool kTf32>
__device__ void StageWindow(const ConvShape& s, const FwdTile& t, const float* __restrict__ xn,
                            int h0, int w0, int c0, int chunks, float* dst) {
  constexpr int kVecs = kChunk / 4;  // 16-byte vectors per staged pixel
  const int pixels = t.rows_in * t.cols_in, window = pixels * kPixStride;
  for (int i = threadIdx.x; i < pixels * kVecs * chunks; i += blockDim.x) {
    const int v = i % kVecs;
    int chunk, row;
    const int pos = t.window_div.Mod(i / kVecs, &chunk);
    const int col = t.cols_div.Mod(pos, &row);
    const int h = h0 + row, wc = w0 + col;
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (h >= 0 && h < s.h && wc >= 0 && wc < s.w) {
      val = *reinterpret_cast<const float4*>(xn + (static_cast<int64_t>(h) * s.w + wc) * s.c + c0 +
                                             chunk * kChunk + v * 4);
    }
    if (kTf32) {
      val = make_float4(RoundTf32(val.x), RoundTf32(val.y), RoundTf32(val.z), RoundTf32(val.w));
    }
    *reinterpret_cast<float4*>(dst + chunk * window + pos * kPixStride + v * 4) = val;
  }
}

// Teams 1.. of a block hand their kCount accumulators to team 0, which adds them in team
// order (the same bits on every run). red: shared memory for (teams - 1) x kCount x
// team_threads floats, free once every thread is past the main loop. False for the threads
// of teams 1.., which are done.
template <int kCount>
__device__ bool GatherTeams(float* acc, int teams, int team, int lt, int team_threads, float* red) {
  __syncthreads();
  if (team > 0) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) red[((team - 1) * kCount + i) * team_threads + lt] = acc[i];
  }
  __syncthreads();
  if (team > 0) return false;
  for (int other = 0; other < teams - 1; ++other) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) acc[i] += red[(other * kCount + i) * team_threads + lt];
  }
  return true;
}

// Shared-memory offset of filter element (tap, c, k_local) in the [tap][c][half][kg][4] layout.
template <int KT>
__device__ __forceinline__ int FilterSlot(int tap, int c, int kl) {
  constexpr int kGroups = KT / 8;
  return (((tap * kChunk + c) * 2 + (kl & 7) / 4) * kGroups + kl / 8) * 4 + (kl & 3);
}

// Stages filter w[K, taps, C]'s channels [c0, c0 + 16) of outputs [k0, k0 + KT).
template <int KT>
__device__ void StageFilter(const float* __restrict__ w, int taps, int channels, int k0, int c0,
                            float* w_s) {
  const int vecs = KT * taps * (kChunk / 4);
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
    const int v = i % (kChunk / 4), rest = i / (kChunk / 4);
    const int tap = rest % taps, kl = rest / taps;
    const float4 val = *reinterpret_cast<const float4*>(
        w + (static_cast<int64_t>(k0 + kl) * taps + tap) * channels + c0 + v * 4);
#pragma unroll
    for (int e = 0; e < 4; ++e) w_s[FilterSlot<KT>(tap, v * 4 + e, kl)] = Lane(val, e);
  }
}

template <int KT>
__global__ void __launch_bounds__(256)
    ForwardKernel(ConvShape s, FwdTile t, const float* __restrict__ x, const float* __restrict__ w,
                  float* __restrict__ y) {
  constexpr int kGroups = KT / 8;
  extern __shared__ float4 smem[];
  const int window = t.rows_in * t.cols_in * kPixStride, taps = s.r * s.s;
  const int filter_chunk = taps * kChunk * KT;
  float* in_all = reinterpret_cast<float*>(smem);
  float* w_all = in_all + t.ksplit * window;
  const int ho = s.ho(), wo = s.wo();
  int tile_row;
  const int q0 = t.tiles_w_div.Mod(blockIdx.x, &tile_row) * t.tw, p0 = tile_row * t.th;
  const int n = blockIdx.y, k0 = blockIdx.z * KT;
  const int h0 = p0 * s.stride_h - s.pad_h, w0 = q0 * s.stride_w - s.pad_w;
  const int groups = t.th * t.tw / kPx, team = groups * kGroups;
  const int rep = threadIdx.x / team, lt = threadIdx.x % team;
  const int kg = lt % kGroups, pg = lt / kGroups;
  const float* in_s = in_all + rep * window;
  const float* w_s = w_all + rep * filter_chunk;
  int base[kPx];
#pragma unroll
  for (int j = 0; j < kPx; ++j) {
    base[j] = StagedPixel(s, t, pg + j * groups, kPixStride);
  }
  float acc[kPx][8] = {};
  const float* xn = x + static_cast<int64_t>(n) * s.h * s.w * s.c;
  // Each round stages ksplit chunks of 16 channels; replica `rep` reduces over chunk `rep`.
  for (int c_round = 0; c_round < s.c; c_round += kChunk * t.ksplit) {
    __syncthreads();
    StageWindow<false>(s, t, xn, h0, w0, c_round, t.ksplit, in_all);
    for (int chunk = 0; chunk < t.ksplit; ++chunk) {
      StageFilter<KT>(w, taps, s.c, k0, c_round + chunk * kChunk, w_all + chunk * filter_chunk);
    }
    __syncthreads();
    for (int r = 0; r < s.r; ++r) {
      for (int q = 0; q < s.s; ++q) {
        const int off = (r * t.cols_in + q) * kPixStride;
        const float* wt = w_s + (r * s.s + q) * kChunk * 8 * kGroups + kg * 4;
#pragma unroll
        for (int v = 0; v < kChunk / 4; ++v) {
          float4 xin[kPx];
#pragma unroll
          for (int j = 0; j < kPx; ++j) {
            xin[j] = *reinterpret_cast<const float4*>(in_s + base[j] + off + v * 4);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float* wc = wt + (v * 4 + e) * 8 * kGroups;
            const float4 lo = *reinterpret_cast<const float4*>(wc);
            const float4 hi = *reinterpret_cast<const float4*>(wc + 4 * kGroups);
#pragma unroll
            for (int j = 0; j < kPx; ++j) Fma8(acc[j], Lane(xin[j], e), lo, hi);
          }
        }
      }
    }
  }
  if (t.ksplit > 1 &&
      !GatherTeams<kPx * 8>(&acc[0][0], t.ksplit, rep, lt, team, reinterpret_cast<float*>(smem))) {
    return;
  }
#pragma unroll
  for (int j = 0; j < kPx; ++j) {
    const int pix = pg + j * groups;
    int row;
    const int q = q0 + t.tw_div.Mod(pix, &row), p = p0 + row;
    if (p >= ho || q >= wo) continue;
    float* out = y + ((static_cast<int64_t>(n) * ho + p) * wo + q) * s.k + k0 + kg * 8;
    *reinterpret_cast<float4*>(out) = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    *reinterpret_cast<float4*>(out + 4) = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
  }
}

// ---- TF32 tensor-core forward (mma.sync m16n8k8) ----
// The same blocks, staging and channel split as ForwardKernel, but each warp multiplies
// 32 pixels (two 16-row tiles) by all KT output channels on tensor cores. Operands are rounded
// to TF32 (round to nearest, as cuDNN's TF32) once, when staged; the filter chunk is stored
// [tap][c][k] with rows of KT + 8 floats, so that the four channel rows a B fragment reads
// fall in different banks.

constexpr int kWarpPixels = 32;  // two m16 tiles per warp

// The tensor-core kernels' tile: the tile's pixels in warps of 32, teams as TeamSplit says.
struct MmaTile {
  FwdTile t;
  int warps = 1;  // per team: ceil(tile pixels / 32)
};

// replica_floats(t): the 4-byte words of one team's staged window and filter chunk.
template <typename Replica>
MmaTile ChooseMmaTile(const ConvShape& s, Replica replica_floats) {
  MmaTile m;
  m.t = ChooseTile(s);
  const int pixels = m.t.th * m.t.tw;
  m.warps = (pixels + kWarpPixels - 1) / kWarpPixels;
  m.t.ksplit = TeamSplit(s, m.warps * 32, replica_floats(m.t));
  return m;
}

// Where a tensor-core kernel's thread works: its block's output tile (pixel rows from p0,
// columns from q0, of image n, output channels from k0) and window origin (h0, w0), its team
// (teams split the input channels), its warp (32 of the tile's pixels: rows g and g + 8 of two
// m16 tiles) and its lane's fragment row g and column group tq.
struct MmaWarp {
  int ho, wo, tile, p0, q0, n, k0, h0, w0, team_threads, rep, lt, warp, g, tq;
  __device__ MmaWarp(const ConvShape& s, const FwdTile& t, int kt)
      : ho(s.ho()), wo(s.wo()), tile(t.th * t.tw) {
    int tile_row;
    q0 = t.tiles_w_div.Mod(blockIdx.x, &tile_row) * t.tw, p0 = tile_row * t.th;
    n = blockIdx.y, k0 = blockIdx.z * kt;
    h0 = p0 * s.stride_h - s.pad_h, w0 = q0 * s.stride_w - s.pad_w;
    team_threads = blockDim.x / t.ksplit;
    rep = threadIdx.x / team_threads, lt = threadIdx.x % team_threads;
    warp = lt / 32, g = lt % 32 / 4, tq = lt % 4;
  }
  // The tile pixel of row g + 8h of m-tile mt.
  __device__ int Pixel(int mt, int h) const { return warp * kWarpPixels + mt * 16 + h * 8 + g; }
  // Its staged window offset, with `stride` values per staged pixel.
  __device__ int Staged(const ConvShape& s, const FwdTile& t, int mt, int h, int stride) const {
    return StagedInTile(s, t, Pixel(mt, h), stride);
  }
  // The staged offset of the pixel whose row the lane gives ldmatrix for m-tile mt: lane l
  // gives row l % 8 of matrix l / 8, pixel l % 8 + 8 * (l / 8 % 2) of the m-tile (matrices 0
  // and 2: rows g; 1 and 3: rows g + 8).
  __device__ int LdmatrixRow(const ConvShape& s, const FwdTile& t, int mt, int stride) const {
    const int lane = lt % 32;
    return StagedInTile(s, t, warp * kWarpPixels + mt * 16 + lane % 8 + 8 * (lane / 8 % 2), stride);
  }
  // A pixel past the tile reads pixel 0 (and is not stored).
  __device__ int StagedInTile(const ConvShape& s, const FwdTile& t, int pix, int stride) const {
    return StagedPixel(s, t, pix < tile ? pix : 0, stride);
  }
};

__device__ __forceinline__ void StorePair(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void StorePair(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// The warp's sums, acc[m-tile][n-tile][the fragment's 4], to y (teams first add theirs into
// team 0's, GatherTeams; smem is free by then): lane (g, tq) holds channels 2tq and 2tq + 1 of
// n-tile nt for its rows g (c0, c1) and g + 8 (c2, c3).
template <int kN, typename T>
__device__ void StoreWarpSums(const ConvShape& s, const FwdTile& t, const MmaWarp& m,
                              float (&acc)[2][kN][4], float* smem, T* __restrict__ y) {
  if (t.ksplit > 1 &&
      !GatherTeams<2 * kN * 4>(&acc[0][0][0], t.ksplit, m.rep, m.lt, m.team_threads, smem)) {
    return;
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pix = m.Pixel(mt, h);
      int row;
      const int q = m.q0 + t.tw_div.Mod(pix, &row), p = m.p0 + row;
      if (pix >= m.tile || p >= m.ho || q >= m.wo) continue;
      T* out = y + ((static_cast<int64_t>(m.n) * m.ho + p) * m.wo + q) * s.k + m.k0 + 2 * m.tq;
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        StorePair(out + nt * 8, acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
    }
}

template <int KT>
__global__ void __launch_bounds__(256)
    ForwardTf32Kernel(ConvShape s, FwdTile t, const float* __restrict__ x,
                      const float* __restrict__ w, float* __restrict__ y) {
  constexpr int kN = KT / 8, kRow = KT + 8;
  extern __shared__ float4 smem[];
  const int window = t.rows_in * t.cols_in * kPixStride, taps = s.r * s.s;
  const int filter_chunk = taps * kChunk * kRow;
  float* in_all = reinterpret_cast<float*>(smem);
  float* w_all = in_all + t.ksplit * window;
  const MmaWarp m(s, t, KT);
  const int g = m.g, tq = m.tq;
  const float* in_s = in_all + m.rep * window;
  const float* w_s = w_all + m.rep * filter_chunk;
  // The staged offsets of the lane's four A rows. (ldmatrix on the 4-byte values, as the bf16
  // kernel reads its A, measured 7% slower here.)
  int base[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) base[mt][h] = m.Staged(s, t, mt, h, kPixStride);
  float acc[2][kN][4] = {};
  const float* xn = x + static_cast<int64_t>(m.n) * s.h * s.w * s.c;
  const int w_vecs = KT * taps * (kChunk / 4);
  for (int c_round = 0; c_round < s.c; c_round += kChunk * t.ksplit) {
    __syncthreads();
    StageWindow<true>(s, t, xn, m.h0, m.w0, c_round, t.ksplit, in_all);
    for (int i = threadIdx.x; i < w_vecs * t.ksplit; i += blockDim.x) {
      // i = ((chunk * KT + kl) * taps + tap) * 4 + v.
      const int v = i % (kChunk / 4);
      int rest;
      const int tap = t.taps_div.Mod(i / (kChunk / 4), &rest);
      const int kl = rest % KT, chunk = rest / KT;
      const float4 val = *reinterpret_cast<const float4*>(
          w + (static_cast<int64_t>(m.k0 + kl) * taps + tap) * s.c + c_round + chunk * kChunk +
          v * 4);
      float* dst = w_all + chunk * filter_chunk + (tap * kChunk + v * 4) * kRow + kl;
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[e * kRow] = RoundTf32(Lane(val, e));
    }
    __syncthreads();
    for (int r = 0; r < s.r; ++r) {
      for (int q = 0; q < s.s; ++q) {
        const int off = (r * t.cols_in + q) * kPixStride;
        const float* wt = w_s + (r * s.s + q) * kChunk * kRow;
#pragma unroll
        for (int kk = 0; kk < kChunk; kk += 8) {
          uint32_t a[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            a[mt][0] = __float_as_uint(in_s[base[mt][0] + off + kk + tq]);
            a[mt][1] = __float_as_uint(in_s[base[mt][1] + off + kk + tq]);
            a[mt][2] = __float_as_uint(in_s[base[mt][0] + off + kk + tq + 4]);
            a[mt][3] = __float_as_uint(in_s[base[mt][1] + off + kk + tq + 4]);
          }
#pragma unroll
          for (int nt = 0; nt < kN; ++nt) {
            const uint32_t b0 = __float_as_uint(wt[(kk + tq) * kRow + nt * 8 + g]);
            const uint32_t b1 = __float_as_uint(wt[(kk + tq + 4) * kRow + nt * 8 + g]);
            MmaTf32(acc[0][nt], a[0], b0, b1);
            MmaTf32(acc[1][nt], a[1], b0, b1);
          }
        }
      }
    }
  }
  StoreWarpSums<kN>(s, t, m, acc, reinterpret_cast<float*>(smem), y);
}

// ---- bf16 tensor-core forward (mma.sync m16n8k16) ----
// bf16 plans' forward and backward data: the TF32 kernel's blocks, teams and warps (32 pixels x
// the block's KT output channels each), with bf16 operands in shared memory. A 16-channel chunk
// of one tap is exactly one k16 step: a warp's A fragment is its pixels' 16 channels of the
// tap, 4-byte pairs of neighbouring channels, and B's the tap's filter rows. The window is
// [pixel][24] (48-byte rows: a warp's 8 neighbouring pixels x 4 pairs fall in 32 distinct
// banks) and the filter chunk [tap][KT][24]. Sums in fp32, rounded to bf16 once.
constexpr int kPixStrideBf16 = kChunk + 8;  // bf16 values per staged pixel or filter row

// Stages `chunks` 16-channel chunks from channel c0 of the bf16 window at (h0, w0) of image xn:
// [chunk][pixel][kPixStrideBf16], zeros in the padding.
__device__ void StageWindowBf16(const ConvShape& s, const FwdTile& t,
                                const uint16_t* __restrict__ xn, int h0, int w0, int c0, int chunks,
                                uint16_t* dst) {
  const int pixels = t.rows_in * t.cols_in, window = pixels * kPixStrideBf16;
  for (int i = threadIdx.x; i < pixels * 2 * chunks; i += blockDim.x) {  // two 16-byte vectors
    const int v = i % 2;                                                 // per pixel
    int chunk, row;
    const int pos = t.window_div.Mod(i / 2, &chunk);
    const int col = t.cols_div.Mod(pos, &row);
    const int h = h0 + row, wc = w0 + col;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (h >= 0 && h < s.h && wc >= 0 && wc < s.w) {
      val = *reinterpret_cast<const uint4*>(xn + (static_cast<int64_t>(h) * s.w + wc) * s.c + c0 +
                                            chunk * kChunk + v * 8);
    }
    *reinterpret_cast<uint4*>(dst + chunk * window + pos * kPixStrideBf16 + v * 8) = val;
  }
}

template <int KT>
__global__ void __launch_bounds__(256)
    ForwardBf16Kernel(ConvShape s, FwdTile t, const uint16_t* __restrict__ x,
                      const uint16_t* __restrict__ w, __nv_bfloat16* __restrict__ y) {
  constexpr int kN = KT / 8;
  extern __shared__ float4 smem[];
  const int window = t.rows_in * t.cols_in * kPixStrideBf16, taps = s.r * s.s;
  const int filter_chunk = taps * KT * kPixStrideBf16;
  auto* in_all = reinterpret_cast<uint16_t*>(smem);
  uint16_t* w_all = in_all + t.ksplit * window;
  const MmaWarp m(s, t, KT);
  const uint16_t* in_s = in_all + m.rep * window;
  // Fragments come by ldmatrix.x4 (lane l gives row l % 8 of matrix l / 8). A, per m-tile:
  // matrices (pixels 0-7, channels 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are a0..a3.
  // B, per two n-tiles: (filters 0-7 of nt, channels 0-7), (the same, 8-15), then nt + 1's
  // are b0, b1 of both (KT 8: nt + 1 reads nt again).
  const int lane = threadIdx.x % 32;
  int a_at[2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
    a_at[mt] = m.LdmatrixRow(s, t, mt, kPixStrideBf16) + 8 * (lane / 16);
  const int b_row = (kN > 1 ? lane / 16 * 8 : 0) + lane % 8;
  const uint16_t* w_s = w_all + m.rep * filter_chunk + b_row * kPixStrideBf16 + 8 * (lane / 8 % 2);
  float acc[2][kN][4] = {};
  const uint16_t* xn = x + static_cast<int64_t>(m.n) * s.h * s.w * s.c;
  const int w_vecs = KT * taps * 2;
  for (int c_round = 0; c_round < s.c; c_round += kChunk * t.ksplit) {
    __syncthreads();
    StageWindowBf16(s, t, xn, m.h0, m.w0, c_round, t.ksplit, in_all);
    for (int i = threadIdx.x; i < w_vecs * t.ksplit; i += blockDim.x) {
      // i = ((chunk * KT + kl) * taps + tap) * 2 + v: w's own order.
      const int v = i % 2;
      int rest;
      const int tap = t.taps_div.Mod(i / 2, &rest);
      const int kl = rest % KT, chunk = rest / KT, row = kl * taps + tap;
      *reinterpret_cast<uint4*>(w_all + chunk * filter_chunk + (tap * KT + kl) * kPixStrideBf16 +
                                v * 8) =
          *reinterpret_cast<const uint4*>(w + (static_cast<int64_t>(m.k0) * taps + row) * s.c +
                                          c_round + chunk * kChunk + v * 8);
    }
    __syncthreads();
    for (int r = 0; r < s.r; ++r) {
      for (int q = 0; q < s.s; ++q) {
        const int off = (r * t.cols_in + q) * kPixStrideBf16;
        const uint16_t* wt = w_s + (r * s.s + q) * KT * kPixStrideBf16;
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) LdMatrixX4(a[mt], in_s + a_at[mt] + off);
#pragma unroll
        for (int nt = 0; nt < kN; nt += 2) {
          uint32_t b[4];
          LdMatrixX4(b, wt + nt * 8 * kPixStrideBf16);
#pragma unroll
          for (int j = 0; j < 2 && nt + j < kN; ++j) {
            MmaBf16(acc[0][nt + j], a[0], b[2 * j], b[2 * j + 1]);
            MmaBf16(acc[1][nt + j], a[1], b[2 * j], b[2 * j + 1]);
          }
        }
      }
    }
  }
  StoreWarpSums<kN>(s, t, m, acc, reinterpret_cast<float*>(smem), y);
}

// The output tiles a backward filter block walks (blockIdx.x, blockIdx.x + gridDim.x, ...):
// tile ti's image and top-left output pixel.
struct TileWalk {
  int tiles_w, per_image, tiles, th, tw;
  __device__ TileWalk(const ConvShape& s, const FwdTile& t) : th(t.th), tw(t.tw) {
    tiles_w = (s.wo() + t.tw - 1) / t.tw;
    per_image = (s.ho() + t.th - 1) / t.th * tiles_w;
    tiles = s.n * per_image;
  }
  struct Tile {
    int n, p0, q0;
  };
  __device__ Tile At(int ti) const {
    const int rest = ti % per_image;
    return {ti / per_image, rest / tiles_w * th, rest % tiles_w * tw};
  }
};

// Stages a backward filter tile's output gradients: `rows` pixels (the tile's, then zero rows
// up to a whole k-step) x output channels [k0, k0 + KT) of image n, as [pixel][ld] in 16-byte
// vectors; zeros past the tile and the map. T: bf16 bits as they are, or floats rounded to
// TF32.
template <int KT, typename T>
__device__ __forceinline__ void StageDyRows(const ConvShape& s, const FwdTile& t,
                                            const T* __restrict__ dy, int n, int p0, int q0, int k0,
                                            int rows, int ld, T* dst) {
  constexpr int kV = 16 / sizeof(T), kVecs = KT / kV;
  const int ho = s.ho(), wo = s.wo(), tile = t.th * t.tw;
  for (int i = threadIdx.x; i < rows * kVecs; i += blockDim.x) {
    const int pix = i / kVecs, kv = i % kVecs * kV;
    int row;
    const int q = q0 + t.tw_div.Mod(pix, &row), p = p0 + row;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (pix < tile && p < ho && q < wo) {
      val = *reinterpret_cast<const uint4*>(
          dy + ((static_cast<int64_t>(n) * ho + p) * wo + q) * s.k + k0 + kv);
      if constexpr (std::is_same_v<T, float>) {
        const auto tf32 = [](uint32_t w) { return __float_as_uint(RoundTf32(__uint_as_float(w))); };
        val = make_uint4(tf32(val.x), tf32(val.y), tf32(val.z), tf32(val.w));
      }
    }
    *reinterpret_cast<uint4*>(dst + pix * ld + kv) = val;
  }
}

// ---- bf16 tensor-core backward filter (mma.sync m16n8k16) ----
// dw[k][tap][c] = sum over pixels of dy[p][k] x[p's tap position][c]: per tap a product whose
// reduction runs over output pixels, 16 at a time. A block owns KT output channels x one
// 16-channel chunk x all kTaps taps (3x3 or 1x1) and walks a fixed set of output tiles (as the
// fp32 kernel), staging each tile's bf16 input window ([pixel][24], StageWindowBf16) and its
// dy rows ([pixel][KT + 8]). Both operands come from ldmatrix.trans with one row address per
// lane: A = dy^T (rows: 16 pixels of k-step, 16 output channels of the warp's m-tile), B = the
// tap's input rows of the same pixels (16 channels), so the strided and padded positions need
// no gather. Warps split the m-tiles and the k-steps; at the end they add their sums in warp
// order (GatherTeams), and the blocks' partial filters are added in a fixed order: the same
// bits on every run.
constexpr int kBwfWarps = 4;
// m16 tiles of KT output channels (KT 8: one, its rows 8-15 unused); the warps of one m-tile
// split the k-steps.
__host__ __device__ constexpr int BwfMTiles(int kt) { return kt >= 16 ? kt / 16 : 1; }
// The TF32 kernel's warps: 4 per m-tile, at most 8. Its k-steps are half the bf16 kernel's,
// and with 4 warps resnet20's 32- and 64-channel layers had one or two warps per m-tile;
// 8 warps there took them 12-20% less time, while 8 on 16 channels (or in the bf16 kernel)
// were slower (docs/PERFORMANCE.md, step 14).
__host__ __device__ constexpr int Tf32BwfWarps(int kt) {
  return 4 * BwfMTiles(kt) < 8 ? 4 * BwfMTiles(kt) : 8;
}

// The end of a tensor-core backward filter block (acc[tap][n-tile][fragment], blockIdx as
// BackwardFilterBf16Kernel's, kWarps warps): warps of the same m-tile add their sums in warp
// order (red: the staged tile, free once every warp is past its last tile), then one warp per
// m-tile writes partial[split][k][tap][c].
template <int KT, int kTaps, int kWarps>
__device__ void StoreBwfPartial(const ConvShape& s, float (&acc)[kTaps][2][4], float* red,
                                float* __restrict__ partial) {
  constexpr int kMt = BwfMTiles(KT), kSteps = kWarps / kMt;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int mt = warp % kMt, k0 = blockIdx.y * KT, c0 = blockIdx.z * kChunk;
  if (!GatherTeams<kTaps * 8>(&acc[0][0][0], kSteps, warp / kMt, mt * 32 + lane, kMt * 32, red)) {
    return;
  }
  float* out = partial + blockIdx.x * (static_cast<int64_t>(s.k) * kTaps * s.c);
#pragma unroll
  for (int tap = 0; tap < kTaps; ++tap) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k = k0 + mt * 16 + g + 8 * h;
        if (k >= k0 + KT) continue;  // KT 8: rows 8-15 of the m-tile are not this block's
        const int c = c0 + nt * 8 + 2 * tq;
        float* o = out + (static_cast<int64_t>(k) * kTaps + tap) * s.c + c;
        o[0] = acc[tap][nt][2 * h];
        o[1] = acc[tap][nt][2 * h + 1];
      }
    }
  }
}

template <int KT, int kTaps>
__global__ void __launch_bounds__(kBwfWarps * 32)
    BackwardFilterBf16Kernel(ConvShape s, FwdTile t, const uint16_t* __restrict__ x,
                             const uint16_t* __restrict__ dy, float* __restrict__ partial) {
  constexpr int kMt = BwfMTiles(KT), kSteps = kBwfWarps / kMt;
  constexpr int kLdd = KT + 8;  // dy row: 16 bytes more than its channels
  extern __shared__ float4 smem[];
  const int tile = t.th * t.tw;
  const int window = t.rows_in * t.cols_in * kPixStrideBf16;
  auto* in_s = reinterpret_cast<uint16_t*>(smem);
  uint16_t* dy_s = in_s + window;  // [tile pixels rounded up to 16][kLdd]
  const int tile16 = (tile + 15) / 16 * 16;
  const int k0 = blockIdx.y * KT, c0 = blockIdx.z * kChunk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int mt = warp % kMt, step0 = warp / kMt;
  const TileWalk walk(s, t);
  // The lane's ldmatrix rows: dy's pixel lane % 8 + 8 * (lane / 16) at channel offset
  // 8 * (lane / 8 % 2) of the m-tile; the input's pixel lane % 8 + 8 * (lane / 8 % 2) at channel
  // 8 * (lane / 16).
  const int a_pix = lane % 8 + 8 * (lane / 16), a_k = mt * 16 + 8 * (lane / 8 % 2);
  const int b_pix = lane % 8 + 8 * (lane / 8 % 2), b_c = 8 * (lane / 16);
  float acc[kTaps][2][4] = {};
  for (int ti = blockIdx.x; ti < walk.tiles; ti += gridDim.x) {
    const auto [n, p0, q0] = walk.At(ti);
    const uint16_t* xn = x + static_cast<int64_t>(n) * s.h * s.w * s.c;
    __syncthreads();
    StageWindowBf16(s, t, xn, p0 * s.stride_h - s.pad_h, q0 * s.stride_w - s.pad_w, c0, 1, in_s);
    StageDyRows<KT>(s, t, dy, n, p0, q0, k0, tile16, kLdd, dy_s);
    __syncthreads();
    for (int st = step0; st < tile16 / 16; st += kSteps) {
      uint32_t a[4];
      LdMatrixX4Trans(a, dy_s + (st * 16 + a_pix) * kLdd + (KT >= 16 ? a_k : 0));
      // The lane's B pixel: its staged position at tap (0, 0); pixels past the tile read
      // pixel 0 (their dy rows are zero).
      const int pix = st * 16 + b_pix;
      const uint16_t* b_at = in_s + StagedPixel(s, t, pix < tile ? pix : 0, kPixStrideBf16) + b_c;
#pragma unroll
      for (int tap = 0; tap < kTaps; ++tap) {
        const int off = ((tap / s.s) * t.cols_in + tap % s.s) * kPixStrideBf16;
        uint32_t b[4];
        LdMatrixX4Trans(b, b_at + off);
        MmaBf16(acc[tap][0], a, b[0], b[1]);
        MmaBf16(acc[tap][1], a, b[2], b[3]);
      }
    }
  }
  StoreBwfPartial<KT, kTaps, kBwfWarps>(s, acc, reinterpret_cast<float*>(smem), partial);
}

// ---- TF32 tensor-core backward filter (mma.sync m16n8k8) ----
// BackwardFilterBf16Kernel's blocks, tile walk and sums (with Tf32BwfWarps warps), on fp32
// operands rounded to TF32 once, when staged: the window as the TF32 forward's ([pixel][20 floats])
// and dy as [pixel][ldd]. A k-step is 8 pixels. ldmatrix cannot transpose 4-byte values, so each
// lane reads its fragments' values itself: A = dy^T (output channels g and g + 8 of the warp's
// m-tile, at the lane's two pixels of the step), B = the tap's input rows (channel g of each
// n-tile, the same two pixels). Which two of the step's 8 pixels are a lane's k-columns tq and
// tq + 4 is free (the product sums over all 8) and is chosen so that the four column groups
// of a warp read distinct banks: at stride 1, pixels 2tq and 2tq + 1 (staged rows 40 floats
// apart, dy rows 2 ldd), at stride 2 pixels tq and tq + 4 (staged rows 40 apart, dy rows ldd);
// DyRowFloats picks ldd to match.
__host__ __device__ constexpr bool Tf32PixelPairs(int stride_w) { return stride_w == 1; }

// dy's staged row in floats: at least KT + 4 (16-byte rows, no two column groups' reads in
// one bank: ldd = 4 or 12 mod 16 when a lane's pixels are pairs, 8 or 24 mod 32 otherwise).
__host__ __device__ constexpr int DyRowFloats(int kt, bool pairs) {
  int ldd = kt + 4;
  while (pairs ? ldd % 16 != 4 && ldd % 16 != 12 : ldd % 32 != 8 && ldd % 32 != 24) ldd += 4;
  return ldd;
}

template <int KT, int kTaps>
__global__ void __launch_bounds__(Tf32BwfWarps(KT) * 32)
    BackwardFilterTf32Kernel(ConvShape s, FwdTile t, const float* __restrict__ x,
                             const float* __restrict__ dy, float* __restrict__ partial) {
  constexpr int kMt = BwfMTiles(KT), kSteps = Tf32BwfWarps(KT) / kMt;
  const bool pairs = Tf32PixelPairs(s.stride_w);
  const int ldd = DyRowFloats(KT, pairs);
  extern __shared__ float4 smem[];
  const int tile = t.th * t.tw, tile8 = (tile + 7) / 8 * 8;
  float* in_s = reinterpret_cast<float*>(smem);
  float* dy_s = in_s + t.rows_in * t.cols_in * kPixStride;  // [tile8][ldd]
  const int k0 = blockIdx.y * KT, c0 = blockIdx.z * kChunk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int mt = warp % kMt, step0 = warp / kMt;
  const int j0 = pairs ? 2 * tq : tq, j1 = pairs ? 2 * tq + 1 : tq + 4;  // the lane's pixels
  const TileWalk walk(s, t);
  float acc[kTaps][2][4] = {};
  for (int ti = blockIdx.x; ti < walk.tiles; ti += gridDim.x) {
    const auto [n, p0, q0] = walk.At(ti);
    const float* xn = x + static_cast<int64_t>(n) * s.h * s.w * s.c;
    __syncthreads();
    StageWindow<true>(s, t, xn, p0 * s.stride_h - s.pad_h, q0 * s.stride_w - s.pad_w, c0, 1, in_s);
    StageDyRows<KT>(s, t, dy, n, p0, q0, k0, tile8, ldd, dy_s);
    __syncthreads();
    for (int st = step0; st < tile8 / 8; st += kSteps) {
      const int pa = st * 8 + j0, pb = st * 8 + j1;
      const float* da = dy_s + pa * ldd + mt * 16 + g;
      const float* db = dy_s + pb * ldd + mt * 16 + g;
      // KT 8: the m-tile's rows 8-15 are zeros (their sums are not stored).
      const uint32_t a[4] = {__float_as_uint(da[0]), KT >= 16 ? __float_as_uint(da[8]) : 0u,
                             __float_as_uint(db[0]), KT >= 16 ? __float_as_uint(db[8]) : 0u};
      // Pixels past the tile read pixel 0 (their dy rows are zero).
      const float* xa = in_s + StagedPixel(s, t, pa < tile ? pa : 0, kPixStride) + g;
      const float* xb = in_s + StagedPixel(s, t, pb < tile ? pb : 0, kPixStride) + g;
#pragma unroll
      for (int tap = 0; tap < kTaps; ++tap) {
        const int off = ((tap / s.s) * t.cols_in + tap % s.s) * kPixStride;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          MmaTf32(acc[tap][nt], a, __float_as_uint(xa[off + nt * 8]),
                  __float_as_uint(xb[off + nt * 8]));
        }
      }
    }
  }
  StoreBwfPartial<KT, kTaps, Tf32BwfWarps(KT)>(s, acc, reinterpret_cast<float*>(smem), partial);
}

// wt[C, R, S, K] = w[K, R-1-r, S-1-s, C]: backward data's filter (fp32 or bf16 bits).
template <typename T>
__global__ void TransposeFlipKernel(ConvShape s, const T* __restrict__ w, T* __restrict__ wt) {
  TOPIARY_GRID_STRIDE(i, static_cast<int64_t>(s.k) * s.r * s.s * s.c) {
    const int k = static_cast<int>(i % s.k);
    const int64_t rest = i / s.k;
    const int q = static_cast<int>(rest % s.s), r = static_cast<int>(rest / s.s % s.r);
    const int c = static_cast<int>(rest / (s.s * s.r));
    wt[i] = w[((static_cast<int64_t>(k) * s.r + (s.r - 1 - r)) * s.s + (s.s - 1 - q)) * s.c + c];
  }
}

// Partial filter gradient of one block: outputs [k0, k0 + KT) x all taps x channels
// [c0, c0 + 16), summed over the output tiles blockIdx.x, blockIdx.x + gridDim.x, ... of the
// batch. Per tile it stages the input window (as the forward kernel) and the tile's output
// gradients; a team of (KT / 8) x taps x 4 threads covers the block's outputs, 8 output
// channels x 4 input channels of one tap each, and `replicas` teams split the tile's pixels
// and add their sums in team order at the end.
template <int KT>
// Three blocks per SM: with fewer registers than ptxas picks unbounded (95), none spilled.
__global__ void __launch_bounds__(288, 3)
    BackwardFilterKernel(ConvShape s, FwdTile t, int replicas, const float* __restrict__ x,
                         const float* __restrict__ dy, float* __restrict__ partial) {
  constexpr int kGroups = KT / 8;
  extern __shared__ float4 smem[];
  const int taps = s.r * s.s, ho = s.ho(), wo = s.wo();
  const int window = t.rows_in * t.cols_in * kPixStride, tile = t.th * t.tw;
  float* in_s = reinterpret_cast<float*>(smem);
  float* dy_s = in_s + window;  // [pixel][half][kg][4]
  const int k0 = blockIdx.y * KT, c0 = blockIdx.z * kChunk;
  const int team = kGroups * taps * (kChunk / 4);
  const int rep = threadIdx.x / team, lt = threadIdx.x % team;
  const int kg = lt % kGroups, c4 = lt / kGroups % (kChunk / 4), tap = lt / kGroups / (kChunk / 4);
  const int tap_off = ((tap / s.s) * t.cols_in + tap % s.s) * kPixStride + c4 * 4;
  const TileWalk walk(s, t);
  float acc[4][8] = {};
  for (int ti = blockIdx.x; ti < walk.tiles; ti += gridDim.x) {
    const auto [n, p0, q0] = walk.At(ti);
    const int h0 = p0 * s.stride_h - s.pad_h, w0 = q0 * s.stride_w - s.pad_w;
    const float* xn = x + static_cast<int64_t>(n) * s.h * s.w * s.c;
    __syncthreads();
    StageWindow<false>(s, t, xn, h0, w0, c0, 1, in_s);
    for (int i = threadIdx.x; i < tile * (KT / 4); i += blockDim.x) {
      const int kl = i % (KT / 4) * 4, pix = i / (KT / 4);
      int row;
      const int q = q0 + t.tw_div.Mod(pix, &row), p = p0 + row;
      float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
      if (p < ho && q < wo) {
        val = *reinterpret_cast<const float4*>(
            dy + ((static_cast<int64_t>(n) * ho + p) * wo + q) * s.k + k0 + kl);
      }
      *reinterpret_cast<float4*>(dy_s + ((pix * 2 + (kl & 7) / 4) * kGroups + kl / 8) * 4) = val;
    }
    __syncthreads();
    // The replica's pixels rep, rep + replicas, ... walked by row and column: a division per
    // pixel cost as many instructions as its 32 FMAs (10% of the kernel's time).
    int row = rep / t.tw, col = rep % t.tw;
    for (int pix = rep; pix < tile; pix += replicas) {
      const int at = (row * s.stride_h * t.cols_in + col * s.stride_w) * kPixStride + tap_off;
      const float4 xv = *reinterpret_cast<const float4*>(in_s + at);
      const float* g = dy_s + (pix * 2 * kGroups + kg) * 4;
      const float4 lo = *reinterpret_cast<const float4*>(g);
      const float4 hi = *reinterpret_cast<const float4*>(g + 4 * kGroups);
      Fma8(acc[0], xv.x, lo, hi);
      Fma8(acc[1], xv.y, lo, hi);
      Fma8(acc[2], xv.z, lo, hi);
      Fma8(acc[3], xv.w, lo, hi);
      for (col += replicas; col >= t.tw; col -= t.tw) ++row;
    }
  }
  if (replicas > 1 &&
      !GatherTeams<32>(&acc[0][0], replicas, rep, lt, team, reinterpret_cast<float*>(smem))) {
    return;
  }
  // partial[split][k][tap][c]
  float* out = partial + blockIdx.x * (static_cast<int64_t>(s.k) * taps * s.c);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int k = k0 + kg * 8 + i;
      out[(static_cast<int64_t>(k) * taps + tap) * s.c + c0 + c4 * 4 + e] = acc[e][i];
    }
  }
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool SmallFilter(const ConvShape& s) {
  return s.r <= 3 && s.s <= 3 && s.stride_h <= 2 && s.stride_w <= 2 && s.pad_h < s.r &&
         s.pad_w < s.s;
}

// The transposed problem backward data runs as a forward convolution.
ConvShape BackwardDataAsForward(const ConvShape& s) {
  ConvShape t = s;
  t.h = s.ho(), t.w = s.wo(), t.c = s.k, t.k = s.c;
  t.pad_h = s.r - 1 - s.pad_h, t.pad_w = s.s - 1 - s.pad_w;
  return t;
}

// Blocks per (output-channel tile, input chunk) of backward filter: about three blocks per SM
// in all, never more than there are output tiles.
int Splits(const ConvShape& s, int sm_count) {
  const FwdTile t = ChooseTile(s);
  const int tiles = s.n * ((s.ho() + t.th - 1) / t.th) * ((s.wo() + t.tw - 1) / t.tw);
  const int blocks = (s.k / ChooseKt(s.k)) * (s.c / kChunk);
  const int want = (3 * std::max(sm_count, 1) + blocks - 1) / blocks;
  return std::max(1, std::min(want, tiles));
}

template <int KT>
absl::Status LaunchForward(const ConvShape& s, const float* x, const float* w, float* y,
                           const CudaContext& ctx) {
  const FwdTile t = ChooseTile(s, KT);
  const int team = t.th * t.tw / kPx * (KT / 8);
  const int smem =
      std::max(t.ksplit * (t.rows_in * t.cols_in * kPixStride + s.r * s.s * kChunk * KT),
               (t.ksplit - 1) * team * kPx * 8) *
      4;
  AllowDynamicSmem<ForwardKernel<KT>>(smem);
  const dim3 grid(((s.ho() + t.th - 1) / t.th) * ((s.wo() + t.tw - 1) / t.tw), s.n, s.k / KT);
  ForwardKernel<KT><<<grid, team * t.ksplit, smem, ctx.stream>>>(s, t, x, w, y);
  return LaunchStatus("direct conv forward");
}

template <int KT>
absl::Status LaunchForwardTf32(const ConvShape& s, const float* x, const float* w, float* y,
                               const CudaContext& ctx) {
  const MmaTile m = ChooseMmaTile(s, [&](const FwdTile& t) {
    return t.rows_in * t.cols_in * kPixStride + s.r * s.s * kChunk * (KT + 8);
  });
  const FwdTile& t = m.t;
  const int team = m.warps * 32;
  const int smem =
      std::max(t.ksplit * (t.rows_in * t.cols_in * kPixStride + s.r * s.s * kChunk * (KT + 8)),
               (t.ksplit - 1) * team * 2 * KT) *
      4;
  AllowDynamicSmem<ForwardTf32Kernel<KT>>(smem);
  const dim3 grid(((s.ho() + t.th - 1) / t.th) * ((s.wo() + t.tw - 1) / t.tw), s.n, s.k / KT);
  ForwardTf32Kernel<KT><<<grid, team * t.ksplit, smem, ctx.stream>>>(s, t, x, w, y);
  return LaunchStatus("direct conv forward (tf32)");
}

template <int KT>
absl::Status LaunchForwardBf16(const ConvShape& s, const uint16_t* x, const uint16_t* w,
                               __nv_bfloat16* y, const CudaContext& ctx) {
  const MmaTile m = ChooseMmaTile(s, [&](const FwdTile& t) {  // bf16 values count half
    return (t.rows_in * t.cols_in + s.r * s.s * KT) * kPixStrideBf16 / 2;
  });
  const FwdTile& t = m.t;
  const int team = m.warps * 32;
  const int smem =
      std::max(t.ksplit * (t.rows_in * t.cols_in + s.r * s.s * KT) * kPixStrideBf16 * 2,
               (t.ksplit - 1) * team * 2 * KT * 4);
  AllowDynamicSmem<ForwardBf16Kernel<KT>>(smem);
  const dim3 grid(((s.ho() + t.th - 1) / t.th) * ((s.wo() + t.tw - 1) / t.tw), s.n, s.k / KT);
  ForwardBf16Kernel<KT><<<grid, team * t.ksplit, smem, ctx.stream>>>(s, t, x, w, y);
  return LaunchStatus("direct conv forward (bf16)");
}

// f(std::integral_constant<int, KT>()) for the output-channel tile ChooseKt(k): the kernels
// are instantiated per tile width.
template <typename F>
absl::Status WithKt(int k, F&& f) {
  switch (ChooseKt(k)) {
    case 64:
      return f(std::integral_constant<int, 64>());
    case 32:
      return f(std::integral_constant<int, 32>());
    case 16:
      return f(std::integral_constant<int, 16>());
    default:
      return f(std::integral_constant<int, 8>());
  }
}

absl::Status Forward(const ConvShape& s, const float* x, const float* w, float* y, bool tf32,
                     const CudaContext& ctx) {
  return WithKt(s.k, [&](auto kt) {
    constexpr int KT = decltype(kt)::value;
    return tf32 ? LaunchForwardTf32<KT>(s, x, w, y, ctx) : LaunchForward<KT>(s, x, w, y, ctx);
  });
}

absl::Status ForwardBf16(const ConvShape& s, const Bf16* x, const Bf16* w, Bf16* y,
                         const CudaContext& ctx) {
  return WithKt(s.k, [&](auto kt) {
    return LaunchForwardBf16<decltype(kt)::value>(s, reinterpret_cast<const uint16_t*>(x),
                                                  reinterpret_cast<const uint16_t*>(w),
                                                  reinterpret_cast<__nv_bfloat16*>(y), ctx);
  });
}

// Backward data's filter, transposed and flipped into the workspace.
template <typename T>
absl::Status TransposeFlip(const ConvShape& s, const T* w, T* wt, const CudaContext& ctx) {
  const int64_t filter = static_cast<int64_t>(s.k) * s.r * s.s * s.c;
  TransposeFlipKernel<T><<<BlocksFor(filter, ctx.sm_count), kThreads, 0, ctx.stream>>>(s, w, wt);
  return LaunchStatus("direct conv filter transpose");
}

template <int KT>
absl::Status LaunchBackwardFilter(const ConvShape& s, const float* x, const float* dy,
                                  float* partial, int splits, const CudaContext& ctx) {
  const FwdTile t = ChooseTile(s);
  const int team = (KT / 8) * s.r * s.s * (kChunk / 4);
  const int replicas = std::max(1, 288 / team);
  const int smem =
      std::max(t.rows_in * t.cols_in * kPixStride + t.th * t.tw * KT, (replicas - 1) * team * 32) *
      4;
  AllowDynamicSmem<BackwardFilterKernel<KT>>(smem);
  const dim3 grid(splits, s.k / KT, s.c / kChunk);
  BackwardFilterKernel<KT>
      <<<grid, team * replicas, smem, ctx.stream>>>(s, t, replicas, x, dy, partial);
  return LaunchStatus("direct conv backward filter");
}

// A tensor-core backward filter's shared memory: its staged tile (`stage` bytes) or, at the
// end, the kWarps warps' sums (StoreBwfPartial), whichever is larger.
template <int KT, int kTaps, int kWarps>
int BwfSmemBytes(int stage) {
  constexpr int kMt = BwfMTiles(KT), kSteps = kWarps / kMt;
  return std::max(stage, (kSteps - 1) * kTaps * 8 * kMt * 32 * 4);
}

template <int KT, int kTaps>
absl::Status LaunchBackwardFilterBf16(const ConvShape& s, const Bf16* x, const Bf16* dy,
                                      float* partial, int splits, const CudaContext& ctx) {
  const FwdTile t = ChooseTile(s);
  const int tile16 = (t.th * t.tw + 15) / 16 * 16;
  const int smem = BwfSmemBytes<KT, kTaps, kBwfWarps>(
      (t.rows_in * t.cols_in * kPixStrideBf16 + tile16 * (KT + 8)) * 2);
  constexpr auto kernel = BackwardFilterBf16Kernel<KT, kTaps>;
  AllowDynamicSmem<kernel>(smem);
  const dim3 grid(splits, s.k / KT, s.c / kChunk);
  kernel<<<grid, kBwfWarps * 32, smem, ctx.stream>>>(
      s, t, reinterpret_cast<const uint16_t*>(x), reinterpret_cast<const uint16_t*>(dy), partial);
  return LaunchStatus("direct conv backward filter (bf16)");
}

template <int KT, int kTaps>
absl::Status LaunchBackwardFilterTf32(const ConvShape& s, const float* x, const float* dy,
                                      float* partial, int splits, const CudaContext& ctx) {
  const FwdTile t = ChooseTile(s);
  const int tile8 = (t.th * t.tw + 7) / 8 * 8;
  constexpr int kWarps = Tf32BwfWarps(KT);
  const int smem = BwfSmemBytes<KT, kTaps, kWarps>(
      (t.rows_in * t.cols_in * kPixStride + tile8 * DyRowFloats(KT, Tf32PixelPairs(s.stride_w))) *
      4);
  constexpr auto kernel = BackwardFilterTf32Kernel<KT, kTaps>;
  AllowDynamicSmem<kernel>(smem);
  const dim3 grid(splits, s.k / KT, s.c / kChunk);
  kernel<<<grid, kWarps * 32, smem, ctx.stream>>>(s, t, x, dy, partial);
  return LaunchStatus("direct conv backward filter (tf32)");
}

// The taps the tensor-core backward filters hold as accumulators: 3x3 and 1x1 filters.
bool TensorCoreFilterTaps(const ConvShape& s) { return s.r * s.s == 9 || s.r * s.s == 1; }

// TF32 on tensor cores where the filter is 3x3 or 1x1; else (and without tf32) fp32 FMAs,
// which a TF32 plan may run too.
absl::Status BackwardFilter(const ConvShape& s, const float* x, const float* dy, float* partial,
                            int splits, bool tf32, const CudaContext& ctx) {
  return WithKt(s.k, [&](auto kt) {
    constexpr int KT = decltype(kt)::value;
    if (!tf32 || !TensorCoreFilterTaps(s)) {
      return LaunchBackwardFilter<KT>(s, x, dy, partial, splits, ctx);
    }
    return s.r * s.s == 1 ? LaunchBackwardFilterTf32<KT, 1>(s, x, dy, partial, splits, ctx)
                          : LaunchBackwardFilterTf32<KT, 9>(s, x, dy, partial, splits, ctx);
  });
}

absl::Status BackwardFilterBf16(const ConvShape& s, const Bf16* x, const Bf16* dy, float* partial,
                                int splits, const CudaContext& ctx) {
  return WithKt(s.k, [&](auto kt) {
    constexpr int KT = decltype(kt)::value;
    return s.r * s.s == 1 ? LaunchBackwardFilterBf16<KT, 1>(s, x, dy, partial, splits, ctx)
                          : LaunchBackwardFilterBf16<KT, 9>(s, x, dy, partial, splits, ctx);
  });
}

// dw = the blocks' partial filters added in a fixed order (SumPartsKernel), fp32 or bf16.
template <typename T>
absl::Status SumSplits(const ConvShape& s, const float* partial, int splits, T* dw,
                       const CudaContext& ctx) {
  const int64_t filter = static_cast<int64_t>(s.k) * s.r * s.s * s.c;
  SumPartsKernel<<<SumPartsBlocks(filter), kSumPartsThreads, 0, ctx.stream>>>(splits, filter,
                                                                              partial, dw);
  return LaunchStatus("direct conv backward filter sum");
}

absl::Status CheckPointers(std::initializer_list<const void*> ptrs, const char* pass) {
  for (const void* p : ptrs) {
    if (!Aligned(p)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("direct conv %s: operands must be 16-byte aligned", pass));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool DirectConvSupported(const ConvShape& s, int pass) {
  if (!CheckConvShape(s).ok() || !SmallFilter(s) || s.c > kMaxChannels || s.k > kMaxChannels) {
    return false;
  }
  switch (pass) {
    case 0:
    case 2:
      // Backward filter: 8 output channels x one tap x 4 inputs per thread, <= 288 threads.
      return s.c % kChunk == 0 && s.k % 8 == 0;
    case 1:
      return s.stride_h == 1 && s.stride_w == 1 && s.k % kChunk == 0 && s.c % 8 == 0;
    default:
      return false;
  }
}

size_t DirectConvWorkspaceBytes(const ConvShape& s, int pass, int sm_count) {
  const size_t filter = static_cast<size_t>(s.k) * s.r * s.s * s.c * sizeof(float);
  if (pass == 1) return filter;
  if (pass == 2) return filter * Splits(s, sm_count);
  return 0;
}

absl::Status DirectConvForwardCuda(const ConvShape& s, const float* x, const float* w, float* y,
                                   bool tf32, const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckPointers({x, w, y}, "forward"));
  return Forward(s, x, w, y, tf32, ctx);
}

absl::Status DirectConvBackwardDataCuda(const ConvShape& s, const float* dy, const float* w,
                                        float* dx, void* workspace, bool tf32,
                                        const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckPointers({dy, w, dx, workspace}, "backward data"));
  float* wt = static_cast<float*>(workspace);
  TOPIARY_RETURN_IF_ERROR(TransposeFlip(s, w, wt, ctx));
  return Forward(BackwardDataAsForward(s), dy, wt, dx, tf32, ctx);
}

bool DirectConvBf16Supported(const ConvShape& s, int pass) {
  // Backward filter: the taps are the kernel's accumulators (3x3 or 1x1).
  return DirectConvSupported(s, pass) && (pass != 2 || TensorCoreFilterTaps(s));
}

namespace {
absl::Status CheckBf16Shape(const ConvShape& s, int pass, const char* what) {
  if (DirectConvBf16Supported(s, pass)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("direct conv %s (bf16): shape not supported", what));
}
}  // namespace

absl::Status DirectConvForwardBf16Cuda(const ConvShape& s, const Bf16* x, const Bf16* w, Bf16* y,
                                       const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckPointers({x, w, y}, "forward"));
  TOPIARY_RETURN_IF_ERROR(CheckBf16Shape(s, 0, "forward"));
  return ForwardBf16(s, x, w, y, ctx);
}

absl::Status DirectConvBackwardDataBf16Cuda(const ConvShape& s, const Bf16* dy, const Bf16* w,
                                            Bf16* dx, void* workspace, const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckPointers({dy, w, dx, workspace}, "backward data"));
  TOPIARY_RETURN_IF_ERROR(CheckBf16Shape(s, 1, "backward data"));
  auto* wt = static_cast<Bf16*>(workspace);
  TOPIARY_RETURN_IF_ERROR(TransposeFlip(s, w, wt, ctx));
  return ForwardBf16(BackwardDataAsForward(s), dy, wt, dx, ctx);
}

absl::Status DirectConvBackwardFilterCuda(const ConvShape& s, const float* x, const float* dy,
                                          float* dw, void* workspace, bool tf32,
                                          const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckPointers({x, dy, dw, workspace}, "backward filter"));
  float* partial = static_cast<float*>(workspace);
  const int splits = Splits(s, ctx.sm_count);
  TOPIARY_RETURN_IF_ERROR(BackwardFilter(s, x, dy, partial, splits, tf32, ctx));
  return SumSplits(s, partial, splits, dw, ctx);
}

absl::Status DirectConvBackwardFilterBf16Cuda(const ConvShape& s, const Bf16* x, const Bf16* dy,
                                              Bf16* dw, void* workspace, const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckPointers({x, dy, dw, workspace}, "backward filter"));
  TOPIARY_RETURN_IF_ERROR(CheckBf16Shape(s, 2, "backward filter"));
  float* partial = static_cast<float*>(workspace);
  const int splits = Splits(s, ctx.sm_count);
  TOPIARY_RETURN_IF_ERROR(BackwardFilterBf16(s, x, dy, partial, splits, ctx));
  return SumSplits(s, partial, splits, dw, ctx);
}

}  // namespace topiary::kernels
