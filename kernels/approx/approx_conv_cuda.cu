// The approximate convolution on the GPU (kernels/approx/approx_conv.h). Everything stays on the
// device: ranges by atomic min/max, parameters by one thread, codes by elementwise kernels,
// then a table convolution with the 128 KiB multiplier table in shared memory.
//
// The table convolution is an implicit GEMM over (pixels x output channels), reduced over the
// patch in chunks of kChunk positions. Each thread holds kTm pixels x kTk channels of int32
// sums; a chunk's activation codes sit in shared memory as table row offsets (Swizzled below),
// so a product is one XOR and one shared-memory load. Table lookups at data-dependent addresses
// cause bank conflicts that nothing can avoid (a table row spans every bank), and they bound the
// speed. Blocks are persistent (one per SM, looping over tiles), so the table is loaded once per
// SM.
#include <climits>

#include "kernels/approx/approx_conv.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {
namespace {

constexpr int kConvThreads = 512;  // threads of a table-convolution block (one per SM)
constexpr int kTm = 8;             // pixels per thread
constexpr int kTk = 4;             // output channels per thread
constexpr int kChunk = 16;         // patch positions per shared-memory stage

// The table in shared memory is swizzled: entry (a, w) lives at (a << 8) | (w ^ ((a & 31) << 1)).
// Unswizzled, a 4-byte bank word holds T[a][2i], T[a][2i+1], so the bank of a lookup depends
// on w alone, and the lanes of a warp that share a weight code (a whole group of pixels) all
// hit one bank. Swizzled, the bank depends on a too. An activation code is kept as
// Swizzled(a), and the lookup index is Swizzled(a) ^ w.
__device__ __forceinline__ uint16_t Swizzled(unsigned a) {
  return static_cast<uint16_t>((a << 8) | ((a & 31u) << 1));
}

// Floats as order-preserving ints, so atomicMin/atomicMax on int give float min/max.
__device__ __forceinline__ int OrderedInt(float f) {
  const int i = __float_as_int(f);
  return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float FromOrderedInt(int i) {
  return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff);
}

// lo and hi become the minimum and maximum over the warp's lanes.
__device__ __forceinline__ void WarpMinMax(float& lo, float& hi) {
  for (int off = 16; off > 0; off /= 2) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, off));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, off));
  }
}

__global__ void ResetRangesKernel(int* ranges) {
  if (threadIdx.x < 4) ranges[threadIdx.x] = threadIdx.x % 2 == 0 ? INT_MAX : INT_MIN;
}

__global__ void RangeKernel(const float* __restrict__ x, int64_t n, int* range) {
  float lo = INFINITY, hi = -INFINITY;
  TOPIARY_GRID_STRIDE(i, n) {
    lo = fminf(lo, x[i]);
    hi = fmaxf(hi, x[i]);
  }
  WarpMinMax(lo, hi);
  if (threadIdx.x % 32 == 0) {
    atomicMin(range, OrderedInt(lo));
    atomicMax(range + 1, OrderedInt(hi));
  }
}

__global__ void ActivationParamsKernel(const int* ranges, QuantParams* params, float* running_range,
                                       bool update_range) {
  params[0] = ActivationParams(FromOrderedInt(ranges[0]), FromOrderedInt(ranges[1]), running_range,
                               update_range);
}

__global__ void QuantizeKernel(const float* __restrict__ x, int64_t n,
                               const QuantParams* __restrict__ param, uint8_t* __restrict__ codes,
                               float* __restrict__ fake) {
  const QuantParams q = *param;
  TOPIARY_GRID_STRIDE(i, n) {
    const uint8_t code = QuantizeCode(x[i], q);
    codes[i] = code;
    if (fake != nullptr) fake[i] = DequantizeCode(code, q);
  }
}

// One block per output channel k: its weight parameters (from its own range, or from the
// whole filter's in ranges[2..3]), params[1 + k], its codes, fake-quantized weights and code
// sum w_sum[k].
__global__ void WeightCodesKernel(const float* __restrict__ w, int patch, const int* ranges,
                                  ApproxWeights weights, QuantParams* params,
                                  uint8_t* __restrict__ w_codes, float* __restrict__ wq,
                                  int32_t* __restrict__ w_sum) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * patch;
  __shared__ float warp_lo[kThreads / 32], warp_hi[kThreads / 32];
  __shared__ int32_t warp_sums[kThreads / 32];
  __shared__ QuantParams q_shared;
  const bool per_channel = weights.scales == WeightScales::kPerChannel;
  if (per_channel) {
    float lo = INFINITY, hi = -INFINITY;
    for (int p = threadIdx.x; p < patch; p += blockDim.x) {
      lo = fminf(lo, w[base + p]);
      hi = fmaxf(hi, w[base + p]);
    }
    WarpMinMax(lo, hi);
    if (threadIdx.x % 32 == 0) {
      warp_lo[threadIdx.x / 32] = lo;
      warp_hi[threadIdx.x / 32] = hi;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float lo = FromOrderedInt(ranges[2]), hi = FromOrderedInt(ranges[3]);
    if (per_channel) {
      lo = warp_lo[0];
      hi = warp_hi[0];
      for (int i = 1; i < kThreads / 32; ++i) {
        lo = fminf(lo, warp_lo[i]);
        hi = fmaxf(hi, warp_hi[i]);
      }
    }
    q_shared = params[1 + blockIdx.x] = WeightParams(lo, hi, weights.code);
  }
  __syncthreads();
  const QuantParams q = q_shared;
  int32_t s = 0;
  for (int p = threadIdx.x; p < patch; p += blockDim.x) {
    const uint8_t code = QuantizeCode(w[base + p], q);
    w_codes[base + p] = code;
    wq[base + p] = DequantizeCode(code, q);
    s += code;
  }
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t total = 0;
    for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
    w_sum[blockIdx.x] = total;
  }
}

// Shared memory of the table convolution for a tile of kTileM pixels x kTileK channels.
template <int kTileK>
struct TableConvSmem {
  static constexpr int kThreadsK = kTileK / kTk;
  static constexpr int kThreadsM = kConvThreads / kThreadsK;
  static constexpr int kTileM = kThreadsM * kTm;
  uint16_t table[kMultiplierEntries];
  uint16_t a[kChunk][kTileM];  // Swizzled(activation code)
  uint16_t w[kChunk][kTileK];  // weight codes
  int pix_base[kTileM];        // offset of the pixel's image in the codes, or -1 past the end
  int pix_h0[kTileM], pix_w0[kTileM];
  int chunk_r[kChunk], chunk_s[kChunk], chunk_c[kChunk];
};

template <int kTileK>
__global__ void __launch_bounds__(kConvThreads, 1)
    TableConvKernel(ConvShape sh, const uint8_t* __restrict__ a_codes,
                    const uint8_t* __restrict__ w_codes, const int32_t* __restrict__ w_sum,
                    const uint16_t* __restrict__ table, const QuantParams* __restrict__ params,
                    const float* __restrict__ bias, float* __restrict__ y) {
  using Smem = TableConvSmem<kTileK>;
  constexpr int kTileM = Smem::kTileM;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);

  // The table, once per block (blocks are persistent), swizzled.
  for (int i = threadIdx.x; i < kMultiplierEntries; i += kConvThreads) {
    sm.table[Swizzled(i >> 8) ^ (i & 255)] = table[i];
  }
  const QuantParams qa = params[0];
  const QuantParams* qw = params + 1;  // per output channel
  const uint16_t pad_code = Swizzled(qa.zero_point);
  const unsigned pad_word = 0x01010101u * static_cast<unsigned>(qa.zero_point);  // 4 pad codes
  // Whole chunks of 16 channels at one filter tap (the codes buffer is 256-byte aligned).
  const bool vector_loads = sh.c % kChunk == 0;
  const int ho = sh.ho(), wo = sh.wo(), patch = sh.patch();
  const int64_t pixels = static_cast<int64_t>(sh.n) * ho * wo;
  const int64_t tiles_m = (pixels + kTileM - 1) / kTileM;
  const int tiles_k = (sh.k + kTileK - 1) / kTileK;
  const int tk = threadIdx.x % Smem::kThreadsK, tm = threadIdx.x / Smem::kThreadsK;

  for (int64_t tile = blockIdx.x; tile < tiles_m * tiles_k; tile += gridDim.x) {
    const int64_t m_base = (tile / tiles_k) * kTileM;
    const int k_base = static_cast<int>(tile % tiles_k) * kTileK;
    __syncthreads();  // the previous tile is done with the pixel table (and the table is in)
    for (int i = threadIdx.x; i < kTileM; i += kConvThreads) {
      const int64_t m = m_base + i;
      if (m < pixels) {
        const int n = static_cast<int>(m / (ho * wo));
        const int rest = static_cast<int>(m % (ho * wo));
        sm.pix_base[i] = n * sh.h * sh.w * sh.c;
        sm.pix_h0[i] = (rest / wo) * sh.stride_h - sh.pad_h;
        sm.pix_w0[i] = (rest % wo) * sh.stride_w - sh.pad_w;
      } else {
        sm.pix_base[i] = -1;
      }
    }
    int32_t acc[kTm][kTk] = {};
    int32_t a_sum[kTm] = {};
    // Vector path: the next chunk's codes are fetched into registers while the current one
    // is being multiplied, so global-memory latency hides behind the table lookups (worth
    // 0.4-2% on resnet20's shapes, H100: the lookups, not the loads, bound the speed).
    constexpr int kPix = (kTileM + kConvThreads - 1) / kConvThreads;
    uint4 next[kPix];
    auto fetch = [&](int p0) {
      const int rs = p0 / sh.c, c0 = p0 % sh.c, r = rs / sh.s, q = rs % sh.s;
#pragma unroll
      for (int u = 0; u < kPix; ++u) {
        const int m = threadIdx.x + u * kConvThreads;
        next[u] = make_uint4(pad_word, pad_word, pad_word, pad_word);
        if (m >= kTileM || sm.pix_base[m] < 0) continue;
        const int ih = sm.pix_h0[m] + r, iw = sm.pix_w0[m] + q;
        if (ih >= 0 && ih < sh.h && iw >= 0 && iw < sh.w) {
          next[u] = *reinterpret_cast<const uint4*>(a_codes + sm.pix_base[m] +
                                                    (ih * sh.w + iw) * sh.c + c0);
        }
      }
    };
    __syncthreads();  // the pixel table is complete
    if (vector_loads) fetch(0);
    for (int p0 = 0; p0 < patch; p0 += kChunk) {
      __syncthreads();  // the previous chunk's operands are consumed
      if (vector_loads) {
        // A chunk is one filter tap and 16 consecutive channels of each pixel.
#pragma unroll
        for (int u = 0; u < kPix; ++u) {
          const int m = threadIdx.x + u * kConvThreads;
          if (m >= kTileM) continue;
          const uint8_t* b = reinterpret_cast<const uint8_t*>(&next[u]);
#pragma unroll
          for (int j = 0; j < kChunk; ++j) sm.a[j][m] = Swizzled(b[j]);
        }
      } else {
        if (threadIdx.x < kChunk) {
          const int p = p0 + threadIdx.x;
          const int rs = p / sh.c;
          sm.chunk_c[threadIdx.x] = p % sh.c;
          sm.chunk_r[threadIdx.x] = rs / sh.s;
          sm.chunk_s[threadIdx.x] = p < patch ? rs % sh.s : -1;  // -1: past the patch
        }
        __syncthreads();
        for (int i = threadIdx.x; i < kChunk * kTileM; i += kConvThreads) {
          const int j = i / kTileM, m = i % kTileM;
          uint16_t code = 0;  // past the patch or the pixels: never summed or stored
          if (sm.chunk_s[j] >= 0 && sm.pix_base[m] >= 0) {
            const int ih = sm.pix_h0[m] + sm.chunk_r[j], iw = sm.pix_w0[m] + sm.chunk_s[j];
            code = pad_code;
            if (ih >= 0 && ih < sh.h && iw >= 0 && iw < sh.w) {
              code = Swizzled(a_codes[sm.pix_base[m] + (ih * sh.w + iw) * sh.c + sm.chunk_c[j]]);
            }
          }
          sm.a[j][m] = code;
        }
      }
      for (int i = threadIdx.x; i < kChunk * kTileK; i += kConvThreads) {
        const int j = i / kTileK, kk = i % kTileK;
        const int k = k_base + kk, p = p0 + j;
        sm.w[j][kk] = k < sh.k && p < patch ? w_codes[static_cast<int64_t>(k) * patch + p] : 0;
      }
      __syncthreads();
      if (vector_loads && p0 + kChunk < patch) fetch(p0 + kChunk);
      const int steps = min(kChunk, patch - p0);
      for (int j = 0; j < steps; ++j) {
        uint16_t a[kTm], w[kTk];
        *reinterpret_cast<uint4*>(a) = *reinterpret_cast<const uint4*>(&sm.a[j][tm * kTm]);
        *reinterpret_cast<uint2*>(w) = *reinterpret_cast<const uint2*>(&sm.w[j][tk * kTk]);
#pragma unroll
        for (int i = 0; i < kTm; ++i) {
          a_sum[i] += a[i] >> 8;
#pragma unroll
          for (int t = 0; t < kTk; ++t) acc[i][t] += sm.table[a[i] ^ w[t]];
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kTm; ++i) {
      const int64_t m = m_base + tm * kTm + i;
      if (m >= pixels) continue;
#pragma unroll
      for (int t = 0; t < kTk; ++t) {
        const int k = k_base + tk * kTk + t;
        if (k >= sh.k) continue;
        const QuantParams q = qw[k];
        const int64_t total = static_cast<int64_t>(acc[i][t]) -
                              static_cast<int64_t>(q.zero_point) * a_sum[i] -
                              static_cast<int64_t>(qa.zero_point) * w_sum[k] +
                              static_cast<int64_t>(patch) * qa.zero_point * q.zero_point;
        y[m * sh.k + k] = ApproxOutput(total, qa.scale * q.scale, bias ? bias[k] : 0.0f);
      }
    }
  }
}

template <int kTileK>
absl::Status LaunchTableConv(const ConvShape& sh, const uint8_t* a_codes, const uint8_t* w_codes,
                             const int32_t* w_sum, const uint16_t* table, const QuantParams* params,
                             const float* bias, float* y, const CudaContext& cuda) {
  using Smem = TableConvSmem<kTileK>;
  const size_t bytes = sizeof(Smem);
  const int64_t pixels = static_cast<int64_t>(sh.n) * sh.ho() * sh.wo();
  const int64_t tiles =
      ((pixels + Smem::kTileM - 1) / Smem::kTileM) * ((sh.k + kTileK - 1) / kTileK);
  const int blocks = static_cast<int>(std::min<int64_t>(tiles, std::max(cuda.sm_count, 1)));
  TableConvKernel<kTileK><<<blocks, kConvThreads, bytes, cuda.stream>>>(sh, a_codes, w_codes, w_sum,
                                                                        table, params, bias, y);
  return LaunchStatus("approximate convolution");
}

template <int kTileK>
absl::Status AllowLargeSmem() {
  return CudaStatus(
      cudaFuncSetAttribute(TableConvKernel<kTileK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(sizeof(TableConvSmem<kTileK>))),
      "approximate convolution: shared memory for the multiplier table");
}

}  // namespace

absl::Status ApproxConvPrepareCuda() {
  TOPIARY_RETURN_IF_ERROR(AllowLargeSmem<16>());
  TOPIARY_RETURN_IF_ERROR(AllowLargeSmem<32>());
  return AllowLargeSmem<64>();
}

size_t ApproxConvWorkspaceBytes(const ConvShape& sh) {
  return ApproxConvWorkspace(sh, nullptr, 0).bytes;
}

absl::Status ApproxConv2dForwardCuda(const ConvShape& sh, const float* x, const float* w,
                                     const float* bias, const uint16_t* table, float* y, float* xq,
                                     float* wq, QuantParams* params, void* workspace,
                                     const CudaContext& cuda, const ApproxConvOptions& o) {
  const int64_t x_count = static_cast<int64_t>(sh.n) * sh.h * sh.w * sh.c;
  const int64_t w_count = static_cast<int64_t>(sh.k) * sh.patch();
  const ApproxConvWorkspace ws(sh, workspace, 0);
  int* ranges = ws.ranges;
  uint8_t *a_codes = ws.a_codes, *w_codes = ws.w_codes;
  int32_t* w_sum = ws.w_sum;
  ResetRangesKernel<<<1, 32, 0, cuda.stream>>>(ranges);
  RangeKernel<<<BlocksFor(x_count, cuda.sm_count), kThreads, 0, cuda.stream>>>(x, x_count, ranges);
  if (o.weights.scales == WeightScales::kPerTensor) {
    RangeKernel<<<BlocksFor(w_count, cuda.sm_count), kThreads, 0, cuda.stream>>>(w, w_count,
                                                                                 ranges + 2);
  }
  ActivationParamsKernel<<<1, 1, 0, cuda.stream>>>(ranges, params, o.running_range, o.update_range);
  QuantizeKernel<<<BlocksFor(x_count, cuda.sm_count), kThreads, 0, cuda.stream>>>(
      x, x_count, params, a_codes, xq);
  WeightCodesKernel<<<sh.k, kThreads, 0, cuda.stream>>>(w, sh.patch(), ranges, o.weights, params,
                                                        w_codes, wq, w_sum);
  TOPIARY_RETURN_IF_ERROR(LaunchStatus("approximate convolution: quantization"));
  if (sh.k <= 16) {
    return LaunchTableConv<16>(sh, a_codes, w_codes, w_sum, table, params, bias, y, cuda);
  }
  if (sh.k <= 32) {
    return LaunchTableConv<32>(sh, a_codes, w_codes, w_sum, table, params, bias, y, cuda);
  }
  return LaunchTableConv<64>(sh, a_codes, w_codes, w_sum, table, params, bias, y, cuda);
}

}  // namespace topiary::kernels
