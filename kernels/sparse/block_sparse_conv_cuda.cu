// Block-sparse convolution on the GPU (see block_sparse_conv.h).
//
// Tensor-core path (bf16, 8-aligned): an implicit GEMM whose rows are output pixels and whose
// columns are 8-channel blocks of the output. A CTA owns BM pixels and a group of 4-32 column
// blocks (WM x WN warps, each MT 16-pixel tiles by NJ column blocks); its reduction runs over
// the filter taps and over the union of the 8-channel blocks of the reduced operand that any
// of its column blocks keeps, eight blocks (a "chunk", 64 channels) at a time. The packed lists
// give, per group and chunk, the eight block indices and one byte per column block saying
// which of them it keeps. Each chunk's activations are staged once in shared memory (a
// cp.async pipeline of 3 or 4 stages, XOR-swizzled for ldmatrix) and loaded into registers once
// per warp; each column block then multiplies only its kept blocks, one m16n8k8 bf16 MMA per
// kept 8x8 block and 16 pixels, under a warp-uniform test of its bit. Backward data is the same
// kernel over the transposed structure: rows are input pixels, the reduced operand is dy
// gathered at the output positions that read each input pixel, and the filter blocks are
// transposed on the way into registers (ldmatrix.trans).
//
// Plain path (fp32, or any block shape): one thread per output element, looping over the kept
// blocks of its column; backward filter (both paths): one CTA per kept block and tap, reducing
// over pixels. These are correct everywhere; whether they beat cuDNN is for the caller to
// measure (trainer/nn/sparse_dispatch.cc does).
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "kernels/runtime/warp_mma.cuh"
#include "kernels/sparse/block_sparse_conv.h"
#include "kernels/sparse/hopper_conv.h"
#include "kernels/sparse/kept_tiles.h"

namespace topiary::kernels {
namespace {

constexpr int kCB = 8;  // 8-channel blocks per chunk (64 channels per pipeline stage)

// ---------------------------------------------------------------------------------------
// Tensor-core kernel.

// The implicit GEMM of one pass. Forward: rows are output pixels (dst = Ho x Wo), the reduced
// operand is x (src = H x W, red_ch = C), out_ch = K. Backward data: rows are input pixels
// (dst = H x W), the reduced operand is dy (src = Ho x Wo, red_ch = K), out_ch = C.
struct TcGeometry {
  int n, dst_h, dst_w, src_h, src_w, red_ch, out_ch;
  int r, s, stride_h, stride_w, pad_h, pad_w;
  int filter_c;  // C: the filter's innermost stride
  int col_blocks;
};

struct TcPackView {
  const int* begin;     // [groups + 1] chunk ranges
  const int* blocks;    // [chunks][kCB] block indices of the reduced operand, -1 = none
  const uint8_t* bits;  // [chunks][group width]: bit b = the column block keeps chunk block b
};

// A CTA: WM x WN warps, each MT 16-pixel tiles by NJ column blocks; a group is the NJ * WN
// column blocks of one CTA column. Shared memory: kStages x (A: BM rows x kCB 16-byte blocks,
// swizzled; B: group width x kCB 8x8 blocks).
template <int MT, int WM, int NJ, int WN, int kStages>
struct TcTile {
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kBM = 16 * MT * WM;
  static constexpr int kGroup = NJ * WN;
  static constexpr int kABytes = kBM * kCB * 16;
  static constexpr int kBBytes = kGroup * kCB * 128;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSmem = kStages * kStageBytes;
  static constexpr int kRowsPerThread = kBM * kCB / kThreads;  // A rows each thread stages
  static constexpr int kBVecs = kGroup * kCB * 8 / kThreads;   // filter rows each thread stages
  static_assert(kRowsPerThread >= 1 && kBM * kCB % kThreads == 0, "A tile and threads");
  static_assert(kBVecs >= 1 && kGroup * kCB * 8 % kThreads == 0, "B tile and threads");
};

// The 16-byte slot of (row, block) in a stage's A tile: XOR-swizzled so that ldmatrix's eight
// row reads of one block fall in distinct banks.
__device__ __forceinline__ int ASlot(int row, int blk) {
  return row * (kCB * 16) + ((blk ^ (row & 7)) * 16);
}

template <int MT, int WM, int NJ, int WN, int kStages, bool kBackwardData>
__global__ void __launch_bounds__(32 * WM * WN)
    TcConvKernel(TcGeometry g, TcPackView pack, const __nv_bfloat16* __restrict__ src,
                 const __nv_bfloat16* __restrict__ w, const float* __restrict__ bias,
                 __nv_bfloat16* __restrict__ out) {
  using Tile = TcTile<MT, WM, NJ, WN, kStages>;
  constexpr int G = Tile::kGroup;
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % WM, wn = warp / WM;
  const int group = blockIdx.y;
  const int64_t rows_total = static_cast<int64_t>(g.n) * g.dst_h * g.dst_w;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * Tile::kBM;
  const int chunk0 = pack.begin[group], chunks = pack.begin[group + 1] - chunk0;
  // The group's chunk lists, copied once into shared memory after the pipeline stages: every
  // iteration reads them, and a global load there would sit in the critical path.
  int* s_blocks = reinterpret_cast<int*>(smem + Tile::kSmem);
  uint8_t* s_bits = reinterpret_cast<uint8_t*>(s_blocks + chunks * kCB);
  for (int i = tid; i < chunks * kCB; i += Tile::kThreads) {
    s_blocks[i] = pack.blocks[chunk0 * kCB + i];
  }
  for (int i = tid; i < chunks * G; i += Tile::kThreads) s_bits[i] = pack.bits[chunk0 * G + i];
  __syncthreads();
  const int taps = g.r * g.s;
  const int total = taps * chunks;

  // The A vectors this thread stages: block slot `slot` of rows tid / kCB + i * (threads /
  // kCB), so that a warp reads whole pixels (kCB consecutive 16-byte vectors) at a time. Per
  // row: the image (-1 past the end) and the corner its taps are relative to; per row and
  // current tap, the source pixel (-1: outside, reads as zeros), recomputed only when the tap
  // changes: address arithmetic per 16-byte copy is a large part of this kernel's cost.
  constexpr int kRowStep = Tile::kThreads / kCB;
  const int slot = tid % kCB;
  int img[Tile::kRowsPerThread], oy[Tile::kRowsPerThread], ox[Tile::kRowsPerThread];
  int pix[Tile::kRowsPerThread];
#pragma unroll
  for (int i = 0; i < Tile::kRowsPerThread; ++i) {
    const int64_t m = row0 + tid / kCB + i * kRowStep;
    if (m < rows_total) {
      img[i] = static_cast<int>(m / (g.dst_h * g.dst_w));
      const int rem = static_cast<int>(m % (g.dst_h * g.dst_w));
      const int y = rem / g.dst_w, x = rem % g.dst_w;
      oy[i] = kBackwardData ? y + g.pad_h : y * g.stride_h - g.pad_h;
      ox[i] = kBackwardData ? x + g.pad_w : x * g.stride_w - g.pad_w;
    } else {
      img[i] = -1;
      oy[i] = ox[i] = 0;
    }
  }
  auto set_tap = [&](int tap) {
    const int tr = tap / g.s, ts = tap % g.s;
#pragma unroll
    for (int i = 0; i < Tile::kRowsPerThread; ++i) {
      int sy, sx;
      bool valid = img[i] >= 0;
      if (kBackwardData) {
        const int ty = oy[i] - tr, tx = ox[i] - ts;
        valid = valid && ty >= 0 && tx >= 0 && ty % g.stride_h == 0 && tx % g.stride_w == 0;
        sy = ty / g.stride_h;
        sx = tx / g.stride_w;
      } else {
        sy = oy[i] + tr;
        sx = ox[i] + ts;
      }
      valid = valid && sy >= 0 && sy < g.src_h && sx >= 0 && sx < g.src_w;
      pix[i] = valid ? (img[i] * g.src_h + sy) * g.src_w + sx : -1;
    }
  };
  // The filter rows this thread stages (fixed per thread): column j of the group, chunk block
  // b, block row rr; the column's first filter row (forward) or channel (backward data).
  int bj[Tile::kBVecs], bb[Tile::kBVecs], brr[Tile::kBVecs];
#pragma unroll
  for (int v = 0; v < Tile::kBVecs; ++v) {
    const int e = tid + v * Tile::kThreads;
    bj[v] = e / (kCB * 8);
    bb[v] = (e / 8) % kCB;
    brr[v] = e % 8;
  }
  int load_tap = -1, load_chunk = 0;  // where the next load reads

  auto load = [&](int stage) {
    if (load_tap < 0 || load_chunk == chunks) {
      load_tap = load_tap < 0 ? 0 : load_tap + 1;
      load_chunk = 0;
      set_tap(load_tap);
    }
    const int chunk = load_chunk++;  // within the group
    const int tap = load_tap;
    char* a_tile = smem + stage * Tile::kStageBytes;
    char* b_tile = a_tile + Tile::kABytes;
    const int my_blk = s_blocks[chunk * kCB + slot];
#pragma unroll
    for (int i = 0; i < Tile::kRowsPerThread; ++i) {
      const int row = tid / kCB + i * kRowStep;
      const bool valid = pix[i] >= 0 && my_blk >= 0;
      const __nv_bfloat16* p =
          valid ? src + static_cast<int64_t>(pix[i]) * g.red_ch + my_blk * 8 : src;
      CpAsync16(a_tile + ASlot(row, slot), p, valid);
    }
    // Filter blocks: G x kCB blocks of 8 rows of 16 bytes; only kept ones are read.
#pragma unroll
    for (int v = 0; v < Tile::kBVecs; ++v) {
      if (!((s_bits[chunk * G + bj[v]] >> bb[v]) & 1)) continue;
      const int blk = s_blocks[chunk * kCB + bb[v]];
      const int col = group * G + bj[v];
      // Forward: rows of the block are output channels (col), its 8 columns input channels
      // (blk). Backward data: rows are output channels (blk), columns input channels (col).
      const int k = kBackwardData ? blk * 8 + brr[v] : col * 8 + brr[v];
      const int c = kBackwardData ? col * 8 : blk * 8;
      const __nv_bfloat16* p = w + (static_cast<int64_t>(k) * taps + tap) * g.filter_c + c;
      CpAsync16(b_tile + (bj[v] * kCB + bb[v]) * 128 + brr[v] * 16, p, true);
    }
  };

  float acc[MT][NJ][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < total) load(st);
    CpAsyncCommit();
  }
  int compute_chunk = 0;
  for (int it = 0; it < total; ++it) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int next = it + kStages - 1;
    if (next < total) load(next % kStages);
    CpAsyncCommit();

    const int stage = it % kStages;
    const char* a_tile = smem + stage * Tile::kStageBytes;
    const char* b_tile = a_tile + Tile::kABytes;
    // This warp's columns' bits for the chunk, one byte per column.
    uint8_t jbits[NJ];
    const uint8_t* chunk_bits = s_bits + compute_chunk * G + wn * NJ;
#pragma unroll
    for (int j = 0; j < NJ; ++j) jbits[j] = chunk_bits[j];
    if (++compute_chunk == chunks) compute_chunk = 0;
    uint32_t a[MT][kCB][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < kCB / 2; ++half) {
        const int q = lane >> 3;
        const int row = wm * MT * 16 + mt * 16 + (q & 1) * 8 + (lane & 7);
        const int blk = half * 2 + (q >> 1);
        uint32_t r[4];
        LdMatrixX4(r, a_tile + ASlot(row, blk));
        a[mt][half * 2][0] = r[0];
        a[mt][half * 2][1] = r[1];
        a[mt][half * 2 + 1][0] = r[2];
        a[mt][half * 2 + 1][1] = r[3];
      }
    }
    // Per quad of chunk blocks: the filter fragments of every column, then the products,
    // columns innermost so that consecutive MMAs accumulate into different registers (a
    // column-major order would chain every MMA on the previous one's result).
#pragma unroll
    for (int quad = 0; quad < kCB / 4; ++quad) {
      uint32_t b[NJ][4];  // stale where not kept: never multiplied
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        if (((jbits[j] >> (quad * 4)) & 0xFu) == 0) continue;
        const char* p =
            b_tile + ((wn * NJ + j) * kCB + quad * 4 + (lane >> 3)) * 128 + (lane & 7) * 16;
        if (kBackwardData) {
          LdMatrixX4Trans(b[j], p);
        } else {
          LdMatrixX4(b[j], p);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int blk = quad * 4 + e;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          if (!((jbits[j] >> blk) & 1u)) continue;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            MmaBf16K8(acc[mt][j], a[mt][blk][0], a[mt][blk][1], b[j][e]);
        }
      }
    }
  }
  CpAsyncWait<0>();

  // Epilogue: bf16 pairs of adjacent channels.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t m = row0 + wm * MT * 16 + mt * 16 + half * 8 + (lane >> 2);
      if (m >= rows_total) continue;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int col = group * G + wn * NJ + j;
        if (col >= g.col_blocks) continue;
        const int ch = col * 8 + (lane & 3) * 2;
        float v0 = acc[mt][j][half * 2], v1 = acc[mt][j][half * 2 + 1];
        if (bias != nullptr) {
          v0 += bias[ch];
          v1 += bias[ch + 1];
        }
        *reinterpret_cast<__nv_bfloat162*>(out + m * g.out_ch + ch) = __floats2bfloat162_rn(v0, v1);
      }
    }
  }
}

// Group widths (column blocks per CTA) the configurations use; one pack each.
constexpr int kGroupWidths[] = {4, 8, 16, 32};
constexpr int kGroupWidthCount = 4;
int GroupIndex(int width) { return width == 4 ? 0 : width == 8 ? 1 : width == 16 ? 2 : 3; }

template <int MT, int WM, int NJ, int WN, int S, bool kBackwardData>
absl::Status LaunchTc(const TcGeometry& g, const TcPackView& pack, int groups, int max_chunks,
                      const void* src, const void* w, const float* bias, void* out,
                      const CudaContext& ctx) {
  using Tile = TcTile<MT, WM, NJ, WN, S>;
  constexpr auto kernel = TcConvKernel<MT, WM, NJ, WN, S, kBackwardData>;
  const int smem = Tile::kSmem + max_chunks * (kCB * 4 + Tile::kGroup);
  TOPIARY_RETURN_IF_ERROR(
      CudaStatus(AllowDynamicSmem<kernel>(smem), "block-sparse conv shared memory"));
  const int64_t rows = static_cast<int64_t>(g.n) * g.dst_h * g.dst_w;
  const dim3 grid(static_cast<unsigned>((rows + Tile::kBM - 1) / Tile::kBM), groups);
  kernel<<<grid, Tile::kThreads, smem, ctx.stream>>>(
      g, pack, static_cast<const __nv_bfloat16*>(src), static_cast<const __nv_bfloat16*>(w), bias,
      static_cast<__nv_bfloat16*>(out));
  return LaunchStatus("block-sparse conv (tensor cores)");
}

using LaunchFn = absl::Status (*)(const TcGeometry&, const TcPackView&, int, int, const void*,
                                  const void*, const float*, void*, const CudaContext&);

// A tile shape: BM = 16 * mt * wm pixels by BN = 8 * nj * wn channels per CTA, in a pipeline of
// `stages`, and its kernels (forward, backward data).
struct TcConfig {
  int mt, wm, nj, wn, stages;
  LaunchFn launch[2];
};
template <int MT, int WM, int NJ, int WN, int S>
constexpr TcConfig Config() {
  return {MT, WM, NJ,
          WN, S,  {&LaunchTc<MT, WM, NJ, WN, S, false>, &LaunchTc<MT, WM, NJ, WN, S, true>}};
}
// The tile shapes Tune chooses among.
constexpr TcConfig kTcConfigs[] = {Config<2, 4, 8, 2, 3>(), Config<2, 2, 8, 4, 3>(),
                                   Config<2, 4, 8, 1, 4>(), Config<1, 4, 8, 1, 4>(),
                                   Config<2, 4, 4, 1, 4>(), Config<2, 2, 8, 2, 4>()};
constexpr int kTcConfigCount = sizeof(kTcConfigs) / sizeof(kTcConfigs[0]);

// ---------------------------------------------------------------------------------------
// Plain kernels.

struct PlainLists {
  const int* col_ptr;   // [cols + 1]
  const int* col_rows;  // kept rows per column (forward)
  const int* row_ptr;   // [rows + 1]
  const int* row_cols;  // kept columns per row (backward data)
  const int2* kept;     // (row, col) of every kept block (backward filter)
  int block_in, block_out;
};

template <typename T>
__global__ void PlainForwardKernel(ConvShape s, PlainLists l, const T* __restrict__ x,
                                   const T* __restrict__ w, const float* __restrict__ bias,
                                   T* __restrict__ y) {
  const int ho = s.ho(), wo = s.wo();
  const int64_t total = static_cast<int64_t>(s.n) * ho * wo * s.k;
  TOPIARY_GRID_STRIDE(i, total) {
    const int k = static_cast<int>(i % s.k);
    const int64_t p = i / s.k;
    const int n = static_cast<int>(p / (ho * wo));
    const int oy = static_cast<int>(p / wo % ho), ox = static_cast<int>(p % wo);
    const int col = k / l.block_out;
    float acc = bias != nullptr ? bias[k] : 0.0f;
    for (int e = l.col_ptr[col]; e < l.col_ptr[col + 1]; ++e) {
      const int c0 = l.col_rows[e] * l.block_in, c1 = min(s.c, c0 + l.block_in);
      for (int r = 0; r < s.r; ++r) {
        const int iy = oy * s.stride_h - s.pad_h + r;
        if (iy < 0 || iy >= s.h) continue;
        for (int t = 0; t < s.s; ++t) {
          const int ix = ox * s.stride_w - s.pad_w + t;
          if (ix < 0 || ix >= s.w) continue;
          const T* in = x + ((static_cast<int64_t>(n) * s.h + iy) * s.w + ix) * s.c;
          const T* wk = w + ((static_cast<int64_t>(k) * s.r + r) * s.s + t) * s.c;
          for (int c = c0; c < c1; ++c) acc += Ld(in + c) * Ld(wk + c);
        }
      }
    }
    St(y + i, acc);
  }
}

template <typename T>
__global__ void PlainBackwardDataKernel(ConvShape s, PlainLists l, const T* __restrict__ dy,
                                        const T* __restrict__ w, T* __restrict__ dx) {
  const int ho = s.ho(), wo = s.wo();
  const int64_t total = static_cast<int64_t>(s.n) * s.h * s.w * s.c;
  TOPIARY_GRID_STRIDE(i, total) {
    const int c = static_cast<int>(i % s.c);
    const int64_t q = i / s.c;
    const int n = static_cast<int>(q / (s.h * s.w));
    const int iy = static_cast<int>(q / s.w % s.h), ix = static_cast<int>(q % s.w);
    const int row = c / l.block_in;
    float acc = 0.0f;
    for (int r = 0; r < s.r; ++r) {
      const int ty = iy + s.pad_h - r;
      if (ty < 0 || ty % s.stride_h != 0 || ty / s.stride_h >= ho) continue;
      for (int t = 0; t < s.s; ++t) {
        const int tx = ix + s.pad_w - t;
        if (tx < 0 || tx % s.stride_w != 0 || tx / s.stride_w >= wo) continue;
        const T* g =
            dy + ((static_cast<int64_t>(n) * ho + ty / s.stride_h) * wo + tx / s.stride_w) * s.k;
        for (int e = l.row_ptr[row]; e < l.row_ptr[row + 1]; ++e) {
          const int k0 = l.row_cols[e] * l.block_out, k1 = min(s.k, k0 + l.block_out);
          for (int k = k0; k < k1; ++k) {
            acc += Ld(g + k) * Ld(w + ((static_cast<int64_t>(k) * s.r + r) * s.s + t) * s.c + c);
          }
        }
      }
    }
    St(dx + i, acc);
  }
}

constexpr int kFilterThreads = 256;

// One CTA per (kept block, tap): each thread owns one element of the block and a slice of the
// pixels; slices are summed in shared memory in a fixed order (deterministic).
template <typename T>
__global__ void __launch_bounds__(kFilterThreads)
    PlainBackwardFilterKernel(ConvShape s, PlainLists l, const T* __restrict__ x,
                              const T* __restrict__ dy, T* __restrict__ dw) {
  __shared__ float partial[kFilterThreads];
  const int2 blk = l.kept[blockIdx.x];
  const int tap = blockIdx.y, tr = tap / s.s, ts = tap % s.s;
  const int c0 = blk.x * l.block_in, k0 = blk.y * l.block_out;
  const int bc = min(l.block_in, s.c - c0), bk = min(l.block_out, s.k - k0);
  const int elems = bc * bk;
  const int ho = s.ho(), wo = s.wo();
  const int64_t pixels = static_cast<int64_t>(s.n) * ho * wo;
  for (int e0 = 0; e0 < elems; e0 += kFilterThreads) {
    const int per = min(elems - e0, kFilterThreads);  // elements this round
    const int slices = kFilterThreads / per;
    const int e = e0 + threadIdx.x % per, slice = threadIdx.x / per;
    float acc = 0.0f;
    if (slice < slices) {
      const int c = c0 + e % bc, k = k0 + e / bc;
      for (int64_t p = slice; p < pixels; p += slices) {
        const int n = static_cast<int>(p / (ho * wo));
        const int oy = static_cast<int>(p / wo % ho), ox = static_cast<int>(p % wo);
        const int iy = oy * s.stride_h - s.pad_h + tr, ix = ox * s.stride_w - s.pad_w + ts;
        if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
        acc += Ld(dy + p * s.k + k) *
               Ld(x + ((static_cast<int64_t>(n) * s.h + iy) * s.w + ix) * s.c + c);
      }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < per) {
      float sum = 0.0f;
      for (int sl = 0; sl < slices; ++sl) sum += partial[sl * per + threadIdx.x];
      const int c = c0 + e % bc, k = k0 + e / bc;
      St(dw + (static_cast<int64_t>(k) * s.r * s.s + tap) * s.c + c, sum);
    }
    __syncthreads();
  }
}

// dbias[k] = sum over pixels of dy[., k]: 32 channels per CTA, 8 warps over pixel slices.
template <typename T>
__global__ void BiasGradKernel(ConvShape s, const T* __restrict__ dy, float* __restrict__ dbias) {
  __shared__ float partial[8][32];
  const int k = blockIdx.x * 32 + (threadIdx.x & 31), slice = threadIdx.x >> 5;
  const int64_t pixels = static_cast<int64_t>(s.n) * s.ho() * s.wo();
  float acc = 0.0f;
  if (k < s.k) {
    for (int64_t p = slice; p < pixels; p += 8) acc += Ld(dy + p * s.k + k);
  }
  partial[slice][threadIdx.x & 31] = acc;
  __syncthreads();
  if (slice == 0 && k < s.k) {
    float sum = 0.0f;
    for (int i = 0; i < 8; ++i) sum += partial[i][threadIdx.x];
    dbias[k] = sum;
  }
}

// ---------------------------------------------------------------------------------------
// Packing (host).

struct HostTcPack {
  std::vector<int> begin;
  std::vector<int> blocks;
  std::vector<uint8_t> bits;
};

// Groups of `width` column blocks; per group, the union of reduced blocks any column keeps, in
// chunks of kCB, and per chunk and column one byte of kept bits. kept(col, red) says whether
// column block col keeps reduced block red.
template <typename KeptFn>
HostTcPack PackTc(int cols, int reds, int width, KeptFn kept) {
  HostTcPack p;
  const int groups = (cols + width - 1) / width;
  p.begin.push_back(0);
  for (int g = 0; g < groups; ++g) {
    const int first = g * width, last = std::min(cols, first + width);
    std::vector<int> used;
    for (int red = 0; red < reds; ++red) {
      for (int col = first; col < last; ++col) {
        if (kept(col, red)) {
          used.push_back(red);
          break;
        }
      }
    }
    for (size_t i = 0; i < used.size(); i += kCB) {
      const size_t chunk = p.bits.size() / width;
      p.blocks.resize((chunk + 1) * kCB, -1);
      p.bits.resize((chunk + 1) * width, 0);
      for (int b = 0; b < kCB && i + b < used.size(); ++b) {
        p.blocks[chunk * kCB + b] = used[i + b];
        for (int col = first; col < last; ++col) {
          if (kept(col, used[i + b])) p.bits[chunk * width + (col - first)] |= 1u << b;
        }
      }
    }
    p.begin.push_back(static_cast<int>(p.bits.size() / width));
  }
  return p;
}

// The most room a plan gives Hopper's filter-gradient partial sums (resnet50's largest
// layer needs 18 MB with every block kept).
constexpr size_t kMaxFilterPartialBytes = size_t{64} << 20;

}  // namespace

struct BlockSparseConvCuda::Device {
  std::vector<void*> allocations;
  PlainLists plain{};
  int kept_blocks = 0;
  struct Tc {
    TcPackView view{};
    int groups = 0;
    int max_chunks = 0;       // in one group
  } tc[2][kGroupWidthCount];  // [forward, backward data][group width]
  // Hopper's kernels whose tiles the grid's blocks align with (hopper_conv.h), with their
  // kept K-tile lists (shared by the configurations of one tile shape): [forward, backward
  // data], configurations after the tensor-core ones.
  struct Hopper {
    int config = 0;  // HopperConvRun's
    const int* count = nullptr;
    const int* index = nullptr;
    int stride = 0;
  };
  std::vector<Hopper> hopper[2];
  // Hopper's backward-filter kernels (configurations after the plain one), each with its
  // work split; they share the room for partial sums, since a plan runs one pass at a time.
  struct Filter {
    int config = 0;  // HopperFilterRun's
    HopperFilterWork work;
  };
  std::vector<Filter> filter;

  ~Device() {
    for (void* p : allocations) cudaFree(p);
  }
  absl::StatusOr<void*> Allocate(size_t bytes) {
    void* p = nullptr;
    TOPIARY_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "block-sparse lists"));
    allocations.push_back(p);
    return p;
  }
  template <typename T>
  absl::StatusOr<const T*> Upload(const std::vector<T>& host) {
    auto allocated = Allocate(host.size() * sizeof(T));
    if (!allocated.ok()) return allocated.status();
    void* p = *allocated;
    if (!host.empty()) {
      TOPIARY_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
                     "block-sparse lists"));
    }
    return static_cast<const T*>(p);
  }
};

BlockSparseConvCuda::~BlockSparseConvCuda() = default;

#define TOPIARY_ASSIGN(lhs, expr)     \
  do {                                \
    auto _v = (expr);                 \
    if (!_v.ok()) return _v.status(); \
    lhs = *_v;                        \
  } while (0)

absl::StatusOr<std::unique_ptr<BlockSparseConvCuda>> BlockSparseConvCuda::Create(
    const ConvShape& s, const BlockGrid& grid, DType dtype, const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckConvShape(s));
  TOPIARY_RETURN_IF_ERROR(CheckBlockGrid(s, grid));
  // The kernels index pixels (not elements) in 32 bits.
  const int64_t pixels = static_cast<int64_t>(s.n) * std::max(s.h * s.w, s.ho() * s.wo());
  if (pixels >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "block-sparse conv: %d images of %dx%d are 2^31 pixels or more", s.n, s.h, s.w));
  }
  std::unique_ptr<BlockSparseConvCuda> plan(new BlockSparseConvCuda());
  plan->shape_ = s;
  plan->dtype_ = dtype;
  plan->d_ = std::make_unique<Device>();
  Device& d = *plan->d_;

  // Plain lists, on the grid as given.
  std::vector<int> col_ptr{0}, col_rows, row_ptr{0}, row_cols;
  std::vector<int2> kept;
  for (int col = 0; col < grid.cols; ++col) {
    for (int row = 0; row < grid.rows; ++row) {
      if (grid.Kept(row, col)) col_rows.push_back(row);
    }
    col_ptr.push_back(static_cast<int>(col_rows.size()));
  }
  for (int row = 0; row < grid.rows; ++row) {
    for (int col = 0; col < grid.cols; ++col) {
      if (grid.Kept(row, col)) {
        row_cols.push_back(col);
        kept.push_back(make_int2(row, col));
      }
    }
    row_ptr.push_back(static_cast<int>(row_cols.size()));
  }
  d.plain.block_in = grid.block_in;
  d.plain.block_out = grid.block_out;
  d.kept_blocks = static_cast<int>(kept.size());
  TOPIARY_ASSIGN(d.plain.col_ptr, d.Upload(col_ptr));
  TOPIARY_ASSIGN(d.plain.col_rows, d.Upload(col_rows));
  TOPIARY_ASSIGN(d.plain.row_ptr, d.Upload(row_ptr));
  TOPIARY_ASSIGN(d.plain.row_cols, d.Upload(row_cols));
  TOPIARY_ASSIGN(d.plain.kept, d.Upload(kept));

  // Tensor cores: bf16, channels and block sides multiples of 8 (the grid refined to 8x8).
  plan->tensor_cores_ = dtype == DType::kBf16 && s.c % 8 == 0 && s.k % 8 == 0 &&
                        grid.block_in % 8 == 0 && grid.block_out % 8 == 0;
  if (plan->tensor_cores_) {
    const int in8 = s.c / 8, out8 = s.k / 8;
    auto kept8 = [&](int in_blk, int out_blk) {
      return grid.Kept(in_blk * 8 / grid.block_in, out_blk * 8 / grid.block_out);
    };
    for (int pass = 0; pass < 2; ++pass) {
      for (int ni = 0; ni < kGroupWidthCount; ++ni) {
        const int nj = kGroupWidths[ni];
        HostTcPack p =
            pass == 0 ? PackTc(out8, in8, nj, [&](int col, int red) { return kept8(red, col); })
                      : PackTc(in8, out8, nj, [&](int col, int red) { return kept8(col, red); });
        Device::Tc& t = d.tc[pass][ni];
        t.groups = static_cast<int>(p.begin.size()) - 1;
        for (int g = 0; g < t.groups; ++g) {
          t.max_chunks = std::max(t.max_chunks, p.begin[g + 1] - p.begin[g]);
        }
        TOPIARY_ASSIGN(t.view.begin, d.Upload(p.begin));
        TOPIARY_ASSIGN(t.view.blocks, d.Upload(p.blocks));
        TOPIARY_ASSIGN(t.view.bits, d.Upload(p.bits));
      }
    }
  }
  // Hopper's kernels read whole K tiles: offered when each tile lies in one block, so the
  // tiles they skip are exactly the pruned blocks and every tile they read is kept.
  for (SparsePass pass : {SparsePass::kForward, SparsePass::kBackwardData}) {
    if (!plan->tensor_cores_) continue;
    const bool fwd = pass == SparsePass::kForward;
    const int red_block = fwd ? grid.block_in : grid.block_out;
    const int out_block = fwd ? grid.block_out : grid.block_in;
    for (int config = 0; config < HopperConvConfigs(pass); ++config) {
      const int tk = HopperConvTileK(pass, config), tn = HopperConvTileN(pass, config);
      const KeptOrder order = HopperConvKeptOrder(pass, config);
      if (red_block % tk != 0 || out_block % tn != 0 || !HopperConvTakes(pass, config, s, ctx)) {
        continue;
      }
      std::vector<Device::Hopper>& offered = d.hopper[fwd ? 0 : 1];
      const auto same_lists = std::find_if(offered.begin(), offered.end(), [&](const auto& o) {
        return HopperConvTileK(pass, o.config) == tk && HopperConvTileN(pass, o.config) == tn &&
               HopperConvKeptOrder(pass, o.config) == order;
      });
      Device::Hopper h;
      if (same_lists != offered.end()) {
        h = *same_lists;
      } else {
        const KeptTiles kept_tiles = MakeKeptTiles(pass, s, grid, tk, tn, order);
        h.stride = kept_tiles.stride;
        TOPIARY_ASSIGN(h.count, d.Upload(kept_tiles.count));
        TOPIARY_ASSIGN(h.index, d.Upload(kept_tiles.index));
      }
      h.config = config;
      offered.push_back(h);
    }
  }
  // Backward filter's: offered when each tile lies in one block (M in an output block, N in
  // an input block), so that the tiles computed are exactly the kept blocks' taps.
  const SparsePass filter = SparsePass::kBackwardFilter;
  size_t partial_floats = 0;  // the most any configuration needs: they share the room
  for (int config = 0; plan->tensor_cores_ && config < HopperConvConfigs(filter); ++config) {
    const int tm = HopperConvTileM(filter, config), tn = HopperConvTileN(filter, config);
    if (grid.block_out % tm != 0 || grid.block_in % tn != 0 ||
        !HopperConvTakes(filter, config, s, ctx)) {
      continue;
    }
    const FilterSplit split =
        MakeFilterSplit(s, grid, tm, tn, HopperConvTileK(filter, config),
                        HopperFilterPhases(config, s), std::max(ctx.sm_count, 1));
    // A slot per piece, about one per kept tile and per CTA: bounded, so that a plan for a
    // very wide layer does not take gigabytes (such a layer keeps cuDNN's filter gradient).
    const size_t floats = static_cast<size_t>(split.partials()) * tm * tn;
    if (floats * sizeof(float) > kMaxFilterPartialBytes) continue;
    Device::Filter f;
    f.config = config;
    HopperFilterWork& w = f.work;
    w.tile_m = tm;
    w.tile_n = tn;
    w.n_tiles = split.n_tiles;
    w.ctas = split.ctas;
    TOPIARY_ASSIGN(w.slot, d.Upload(split.slot));
    TOPIARY_ASSIGN(w.kept_tiles, d.Upload(split.kept_tiles));
    TOPIARY_ASSIGN(w.tile_begin, d.Upload(split.tile_begin));
    TOPIARY_ASSIGN(w.seg_tile, d.Upload(split.seg_tile));
    TOPIARY_ASSIGN(w.seg_k, d.Upload(split.seg_k));
    TOPIARY_ASSIGN(w.seg_count, d.Upload(split.seg_count));
    TOPIARY_ASSIGN(w.seg_piece, d.Upload(split.seg_piece));
    TOPIARY_ASSIGN(w.seg_store, d.Upload(split.seg_store));
    TOPIARY_ASSIGN(w.cta_begin, d.Upload(split.cta_begin));
    partial_floats = std::max(partial_floats, floats);
    d.filter.push_back(f);
  }
  if (!d.filter.empty()) {
    void* partials = nullptr;
    TOPIARY_ASSIGN(partials, d.Allocate(partial_floats * sizeof(float)));
    for (Device::Filter& f : d.filter) f.work.partials = static_cast<float*>(partials);
  }
  // Untuned (a forced dispatch does not tune), each pass runs its first tuned configuration.
  for (SparsePass pass : {SparsePass::kForward, SparsePass::kBackwardData, filter}) {
    while (!plan->tuned(pass, plan->config_[static_cast<int>(pass)])) {
      ++plan->config_[static_cast<int>(pass)];
    }
  }
  return plan;
}

int BlockSparseConvCuda::configs(SparsePass pass) const {
  if (!tensor_cores_) return 1;
  if (pass == SparsePass::kBackwardFilter) return 1 + static_cast<int>(d_->filter.size());
  return kTcConfigCount + static_cast<int>(d_->hopper[static_cast<int>(pass)].size());
}

bool BlockSparseConvCuda::tuned(SparsePass pass, int config) const {
  // The plain filter-gradient kernel is 100-1000x slower than Hopper's (docs/PERFORMANCE.md):
  // one run of it on a large layer outlasts a training step, so it runs only when alone.
  return pass != SparsePass::kBackwardFilter || config > 0 || configs(pass) == 1;
}

absl::Status BlockSparseConvCuda::set_config(SparsePass pass, int config) {
  if (config < 0 || config >= configs(pass)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has no configuration %d", SparsePassName(pass), config));
  }
  config_[static_cast<int>(pass)] = config;
  return absl::OkStatus();
}

std::string BlockSparseConvCuda::config_name(SparsePass pass) const {
  const int config = config_[static_cast<int>(pass)];
  if (pass == SparsePass::kBackwardFilter) {  // the plain kernel, then Hopper's
    return config == 0 ? "plain" : HopperConvConfigName(pass, d_->filter[config - 1].config);
  }
  if (configs(pass) == 1) return "plain";
  if (config >= kTcConfigCount) {
    return HopperConvConfigName(pass,
                                d_->hopper[static_cast<int>(pass)][config - kTcConfigCount].config);
  }
  const TcConfig& c = kTcConfigs[config];
  return absl::StrFormat("tc %dx%d/%d", 16 * c.mt * c.wm, 8 * c.nj * c.wn, c.stages);
}

absl::Status BlockSparseConvCuda::Run(SparsePass pass, int config, const void* in0, const void* in1,
                                      void* out, const float* bias, float* dbias,
                                      const CudaContext& ctx, float* moments) const {
  const ConvShape& s = shape_;
  const Device& d = *d_;
  if (pass == SparsePass::kBackwardFilter) {
    if (config > 0) {  // Hopper's, which writes every entry of dw
      const Device::Filter& f = d.filter[config - 1];
      TOPIARY_RETURN_IF_ERROR(HopperFilterRun(f.config, s, f.work, in0, in1, out, ctx));
    } else {  // the plain kernel writes the kept blocks only
      const size_t bytes = static_cast<size_t>(s.k) * s.patch() * SizeOf(dtype_);
      TOPIARY_RETURN_IF_ERROR(
          CudaStatus(cudaMemsetAsync(out, 0, bytes, ctx.stream), "block-sparse filter gradient"));
    }
    return VisitDType(dtype_, [&](auto t) -> absl::Status {
      using T = decltype(t);
      if (config == 0 && d.kept_blocks > 0) {
        PlainBackwardFilterKernel<T>
            <<<dim3(d.kept_blocks, s.r * s.s), kFilterThreads, 0, ctx.stream>>>(
                s, d.plain, static_cast<const T*>(in0), static_cast<const T*>(in1),
                static_cast<T*>(out));
      }
      if (dbias != nullptr) {
        BiasGradKernel<T>
            <<<(s.k + 31) / 32, 256, 0, ctx.stream>>>(s, static_cast<const T*>(in1), dbias);
      }
      return LaunchStatus("block-sparse conv backward filter");
    });
  }
  if (config >= kTcConfigCount) {
    const Device::Hopper& h = d.hopper[static_cast<int>(pass)][config - kTcConfigCount];
    return HopperConvRun(pass, h.config, s, h.count, h.index, h.stride, in0, in1, bias, out, ctx,
                         moments);
  }
  if (configs(pass) > 1) {
    const bool bwd = pass == SparsePass::kBackwardData;
    TcGeometry g;
    g.n = s.n;
    g.dst_h = bwd ? s.h : s.ho();
    g.dst_w = bwd ? s.w : s.wo();
    g.src_h = bwd ? s.ho() : s.h;
    g.src_w = bwd ? s.wo() : s.w;
    g.red_ch = bwd ? s.k : s.c;
    g.out_ch = bwd ? s.c : s.k;
    g.r = s.r;
    g.s = s.s;
    g.stride_h = s.stride_h;
    g.stride_w = s.stride_w;
    g.pad_h = s.pad_h;
    g.pad_w = s.pad_w;
    g.filter_c = s.c;
    g.col_blocks = g.out_ch / 8;
    const TcConfig& c = kTcConfigs[config];
    const Device::Tc& t = d.tc[bwd ? 1 : 0][GroupIndex(c.nj * c.wn)];
    return c.launch[bwd ? 1 : 0](g, t.view, t.groups, t.max_chunks, in0, in1, bwd ? nullptr : bias,
                                 out, ctx);
  }
  return VisitDType(dtype_, [&](auto t) -> absl::Status {
    using T = decltype(t);
    if (pass == SparsePass::kForward) {
      const int64_t total = static_cast<int64_t>(s.n) * s.ho() * s.wo() * s.k;
      PlainForwardKernel<T><<<BlocksFor(total, ctx.sm_count), kThreads, 0, ctx.stream>>>(
          s, d.plain, static_cast<const T*>(in0), static_cast<const T*>(in1), bias,
          static_cast<T*>(out));
    } else {
      const int64_t total = static_cast<int64_t>(s.n) * s.h * s.w * s.c;
      PlainBackwardDataKernel<T><<<BlocksFor(total, ctx.sm_count), kThreads, 0, ctx.stream>>>(
          s, d.plain, static_cast<const T*>(in0), static_cast<const T*>(in1), static_cast<T*>(out));
    }
    return LaunchStatus("block-sparse conv (plain)");
  });
}

int BlockSparseConvCuda::forward_moment_slices(const CudaContext& ctx) const {
  if (config_[0] < kTcConfigCount) return 0;
  const Device::Hopper& h = d_->hopper[0][config_[0] - kTcConfigCount];
  return HopperConvMomentSlices(h.config, shape_, ctx);
}

absl::Status BlockSparseConvCuda::Forward(const void* x, const void* w, const float* bias, void* y,
                                          const CudaContext& ctx, float* moments) const {
  if (moments != nullptr && forward_moment_slices(ctx) == 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("block-sparse conv forward: %s writes no batch-norm moments",
                        config_name(SparsePass::kForward)));
  }
  return Run(SparsePass::kForward, config_[0], x, w, y, bias, nullptr, ctx, moments);
}

absl::Status BlockSparseConvCuda::BackwardData(const void* dy, const void* w, void* dx,
                                               const CudaContext& ctx) const {
  return Run(SparsePass::kBackwardData, config_[1], dy, w, dx, nullptr, nullptr, ctx);
}

absl::Status BlockSparseConvCuda::BackwardFilter(const void* x, const void* dy, void* dw,
                                                 float* dbias, const CudaContext& ctx) const {
  return Run(SparsePass::kBackwardFilter, config_[2], x, dy, dw, nullptr, dbias, ctx);
}

absl::StatusOr<float> BlockSparseConvCuda::Tune(SparsePass pass, const void* in0, const void* in1,
                                                void* out, const CudaContext& ctx) {
  absl::StatusOr<float> best = absl::InternalError("no configuration");
  for (int config = 0; config < configs(pass); ++config) {
    if (!tuned(pass, config)) continue;
    auto t = TimeOnStream([&] { return Run(pass, config, in0, in1, out, nullptr, nullptr, ctx); },
                          ctx, 5);
    if (!t.ok()) return t.status();
    if (!best.ok() || *t < *best) {
      best = *t;
      config_[static_cast<int>(pass)] = config;
    }
  }
  return best;
}

}  // namespace topiary::kernels
