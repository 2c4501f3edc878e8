// bf16 convolutions of images with few channels on tensor cores (see stem_conv.h).
//
// Forward: a block owns 64 output channels and walks tiles of 128 output pixels (one wave of
// resident blocks); it copies its 64 filters into B [64][kr] once (a filter's KRSC values are
// already one contiguous row). Per tile, each of its 128 threads gathers one pixel's receptive
// field into a row of A [128][kr] in shared memory (column (r * S + s) * C + c, zeros outside
// the image and past R*S*C; GatherRows), then each warp multiplies its 32 rows by the 64
// filters with mma.sync.m16n8k16 (2 x 8 tiles, fp32 sums) and stores bf16 pairs. Rows are
// kr + 8 elements apart, so that the fragment loads of 8 rows x 4 lanes fall in 32 banks.
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

#include "absl/strings/str_format.h"
#include "kernels/conv/stem_conv.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

constexpr int kTileK = 64;       // output channels per block
constexpr int kFwdPixels = 128;  // output pixels per forward block: 4 warps x 32
constexpr int kWgPixels = 64;    // output pixels per backward-filter stage
constexpr int kBlockThreads = 128;
constexpr int kMaxChannels = 4;
constexpr int kMaxRow = 256;     // the longest receptive field, rounded up to 32
constexpr int kMaxSegment = 32;  // the most values of one filter row (S * C)

int RoundUp32(int v) { return (v + 31) / 32 * 32; }

struct Geometry {
  int h, w, c, k, r, s, stride_h, stride_w, pad_h, pad_w, ho, wo;
  int64_t pixels;  // N * Ho * Wo
  int patch;       // R * S * C
  int kr;          // patch rounded up to 32: the reduction (forward) or the rows (backward)
};

Geometry MakeGeometry(const ConvShape& s) {
  Geometry g;
  g.h = s.h, g.w = s.w, g.c = s.c, g.k = s.k, g.r = s.r, g.s = s.s;
  g.stride_h = s.stride_h, g.stride_w = s.stride_w, g.pad_h = s.pad_h, g.pad_w = s.pad_w;
  g.ho = s.ho(), g.wo = s.wo();
  g.pixels = static_cast<int64_t>(s.n) * g.ho * g.wo;
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

__global__ void __launch_bounds__(kBlockThreads)
    StemForwardKernel(Geometry g, const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                      __nv_bfloat16* __restrict__ y) {
  extern __shared__ __align__(16) uint16_t smem[];
  const int ld = g.kr + 8;
  uint16_t* a = smem;                    // [kFwdPixels][ld]: the pixels' receptive fields
  uint16_t* b = smem + kFwdPixels * ld;  // [kTileK][ld]: the filters
  const int t = threadIdx.x;
  const int k0 = blockIdx.y * kTileK;
  // The block's filters and the columns past the patch, once for all its tiles.
  for (int i = t; i < kTileK * g.kr; i += kBlockThreads) {
    const int n = i / g.kr, j = i - n * g.kr;
    b[n * ld + j] = j < g.patch ? w[static_cast<int64_t>(k0 + n) * g.patch + j] : uint16_t{0};
  }
  uint16_t* row = a + t * ld;
  for (int j = g.patch; j < g.kr; ++j) row[j] = 0;
  const int warp = t / 32, lane = t % 32, qr = lane / 4, qc = (lane % 4) * 2;
  const int64_t tiles = (g.pixels + kFwdPixels - 1) / kFwdPixels;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t pix0 = tile * kFwdPixels;
    GatherRows<2>(g, x, pix0 + t, pix0 + t < g.pixels, 0, g.r, row, 1);
    __syncthreads();
    float acc[2][8][4] = {};
    for (int kk = 0; kk < g.kr; kk += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        LoadA(a + (warp * 32 + mt * 16) * ld + kk, ld, qr, qc, af[mt]);
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const uint16_t* q = b + (nt * 8 + qr) * ld + kk + qc;
        const uint32_t b0 = Lds32(q), b1 = Lds32(q + 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) Mma(acc[mt][nt], af[mt], b0, b1);
      }
    }
    __syncthreads();  // every warp has read the tile before the next gather overwrites it
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t p = pix0 + warp * 32 + mt * 16 + half * 8 + qr;
        if (p >= g.pixels) continue;
        __nv_bfloat16* out = y + p * g.k + k0 + qc;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          *reinterpret_cast<__nv_bfloat162*>(out + nt * 8) =
              __floats2bfloat162_rn(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
        }
      }
    }
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

size_t ForwardSmem(const Geometry& g) {
  return static_cast<size_t>(kFwdPixels + kTileK) * (g.kr + 8) * sizeof(uint16_t);
}
size_t WgradSmem(const Geometry& g) {
  return (static_cast<size_t>(g.kr) * (kWgPixels + 8) + kWgPixels * (kTileK + 8)) *
         sizeof(uint16_t);
}

// Blocks of `kernel` with `smem` bytes of shared memory that one multiprocessor holds at once
// (asked each time: the shared memory varies with the shape).
int Resident(const void* kernel, size_t smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kBlockThreads, smem) !=
      cudaSuccess) {
    cudaGetLastError();
    n = 1;
  }
  return std::max(n, 1);
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
  const int64_t want = OneWave(g, stages, sm_count, Resident(WgradKernel(g.kr / 32), WgradSmem(g)));
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
  return (pass == 0 || pass == 2) && CheckConvShape(shape).ok() && shape.c >= 1 &&
         shape.c <= kMaxChannels && shape.k % kTileK == 0 && shape.s * shape.c <= kMaxSegment &&
         RoundUp32(shape.patch()) <= kMaxRow;
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
  const Geometry g = MakeGeometry(shape);
  const int smem = static_cast<int>(ForwardSmem(g));
  AllowDynamicSmem<StemForwardKernel>(smem);
  const int64_t tiles = (g.pixels + kFwdPixels - 1) / kFwdPixels;
  const int64_t blocks = OneWave(g, tiles, ctx.sm_count,
                                 Resident(reinterpret_cast<const void*>(StemForwardKernel), smem));
  StemForwardKernel<<<dim3(static_cast<unsigned>(blocks), g.k / kTileK), kBlockThreads, smem,
                      ctx.stream>>>(g, reinterpret_cast<const uint16_t*>(x),
                                    reinterpret_cast<const uint16_t*>(w),
                                    reinterpret_cast<__nv_bfloat16*>(y));
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
  // Under the default 48 KB; set anyway, as AllowDynamicSmem would, should the rows grow.
  TOPIARY_RETURN_IF_ERROR(
      CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                 "stem conv backward filter"));
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
