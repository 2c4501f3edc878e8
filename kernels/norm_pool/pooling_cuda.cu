#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/norm_pool/pooling.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {
namespace {

// Output index o's window along one axis: it starts at *start (unclipped) and covers [*lo, *hi)
// of the image's `size` rows or columns.
__device__ inline void Span(int o, int stride, int pad, int k, int size, int* start, int* lo,
                            int* hi) {
  *start = o * stride - pad;
  *lo = max(*start, 0);
  *hi = min(*start + k, size);
}

// Output pixel (oh, ow)'s window, clipped to the image.
__device__ inline void Window(const PoolShape& sh, int oh, int ow, int* h0, int* h1, int* w0,
                              int* w1) {
  int hs, ws;
  Span(oh, sh.stride_h, sh.pad_h, sh.r, sh.h, &hs, h0, h1);
  Span(ow, sh.stride_w, sh.pad_w, sh.s, sh.w, &ws, w0, w1);
}

// Output windows that contain any of input rows [i0, i1]: oh in [o0, o1].
__device__ inline void Covering(int i0, int i1, int pad, int k, int stride, int out, int* o0,
                                int* o1) {
  // oh*stride - pad <= i < oh*stride - pad + k
  const int lo_num = i0 + pad - k + 1;
  *o0 = lo_num <= 0 ? 0 : (lo_num + stride - 1) / stride;
  *o1 = min((i1 + pad) / stride, out - 1);
}

// Max pooling also records, when argmax is not null, where in its window each maximum was
// (the first in scan order, as position (row * s + column) of the unclipped window), so the
// backward pass routes gradients with one byte per window instead of rescanning it.
template <bool kMax, typename T>
__global__ void PoolForwardKernel(PoolShape sh, const T* __restrict__ x, T* __restrict__ y,
                                  uint8_t* __restrict__ argmax) {
  const int ho = sh.ho(), wo = sh.wo();
  const int64_t total = static_cast<int64_t>(sh.n) * ho * wo * sh.c;
  TOPIARY_GRID_STRIDE(i, total) {
    const int c = static_cast<int>(i % sh.c);
    int64_t rest = i / sh.c;
    const int ow = static_cast<int>(rest % wo);
    rest /= wo;
    const int oh = static_cast<int>(rest % ho);
    const int n = static_cast<int>(rest / ho);
    int h0, h1, w0, w1;
    Window(sh, oh, ow, &h0, &h1, &w0, &w1);
    const T* img = x + static_cast<int64_t>(n) * sh.h * sh.w * sh.c;
    const int hs = oh * sh.stride_h - sh.pad_h, ws = ow * sh.stride_w - sh.pad_w;
    float acc = kMax ? -FLT_MAX : 0.0f;
    int best = (h0 - hs) * sh.s + (w0 - ws);
    for (int ih = h0; ih < h1; ++ih)
      for (int iw = w0; iw < w1; ++iw) {
        const float v = Ld(img + (static_cast<int64_t>(ih) * sh.w + iw) * sh.c + c);
        if (!kMax) {
          acc += v;
        } else if (v > acc) {
          acc = v;
          best = (ih - hs) * sh.s + (iw - ws);
        }
      }
    St(y + i, kMax ? acc : acc / static_cast<float>(sh.r * sh.s));
    if (kMax && argmax != nullptr) argmax[i] = static_cast<uint8_t>(best);
  }
}

template <bool kMax, typename T>
__global__ void PoolBackwardKernel(PoolShape sh, const uint8_t* __restrict__ argmax,
                                   const T* __restrict__ dy, T* __restrict__ dx) {
  const int ho = sh.ho(), wo = sh.wo();
  const int64_t total = static_cast<int64_t>(sh.n) * sh.h * sh.w * sh.c;
  TOPIARY_GRID_STRIDE(i, total) {
    const int c = static_cast<int>(i % sh.c);
    int64_t rest = i / sh.c;
    const int iw = static_cast<int>(rest % sh.w);
    rest /= sh.w;
    const int ih = static_cast<int>(rest % sh.h);
    const int n = static_cast<int>(rest / sh.h);
    int oh0, oh1, ow0, ow1;
    Covering(ih, ih, sh.pad_h, sh.r, sh.stride_h, ho, &oh0, &oh1);
    Covering(iw, iw, sh.pad_w, sh.s, sh.stride_w, wo, &ow0, &ow1);
    const int64_t out_base = static_cast<int64_t>(n) * ho * wo;
    float g = 0.0f;
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int64_t o = (out_base + static_cast<int64_t>(oh) * wo + ow) * sh.c + c;
        // Routed here only if this pixel is the window's recorded maximum.
        const int pos =
            (ih - (oh * sh.stride_h - sh.pad_h)) * sh.s + (iw - (ow * sh.stride_w - sh.pad_w));
        if (!kMax || argmax[o] == pos) g += Ld(dy + o);
      }
    St(dx + i, kMax ? g : g / static_cast<float>(sh.r * sh.s));
  }
}

// The same max pooling over 16-byte channel vectors (kVec<T> channels per thread), with
// 32-bit index arithmetic: the scalar kernels spend most of their time in 64-bit divisions
// (four per element), these one set per vector. For C % kVec<T> == 0, 16-byte aligned
// tensors and fewer than 2^31 vectors (MaxPoolVecOk); results are identical to the scalar
// kernels (the same first-maximum rule, the same sums in the same order).
// V argmax bytes (V = 4 or 8) as one aligned 4- or 8-byte access.
template <int V>
__device__ inline void StoreBytes(uint8_t* p, const uint8_t (&b)[V]) {
  using Word = std::conditional_t<V == 8, uint2, uint32_t>;
  Word w;
  memcpy(&w, b, V);
  *reinterpret_cast<Word*>(p) = w;
}
template <int V>
__device__ inline void LoadBytes(const uint8_t* p, uint8_t (&b)[V]) {
  using Word = std::conditional_t<V == 8, uint2, uint32_t>;
  const Word w = *reinterpret_cast<const Word*>(p);
  memcpy(b, &w, V);
}

// The max-pool forward kernel's threads: each keeps one column j of a row of `cols` vectors (the
// grid has a multiple of `cols` threads, RowWalkThreads) and walks the rows of every image, a
// fixed step apart, tracking (image, row) without a division per step; the column's indices
// and window bounds are worked out once per thread. (The backward kernel walked this way too
// moved 20% more DRAM bytes, neighbouring input rows no longer read together, and ran 0.81-0.86
// ms against 0.70 on an H200: it keeps its flat index.)
struct RowWalk {
  int j, n, row;         // the column; the current image and row in it
  int step_n, step_row;  // the step, as whole images and rows
  int rows;              // rows per image
  __device__ RowWalk(int64_t threads, int cols, int rows_per_image) : rows(rows_per_image) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t first = t < threads ? t / cols : INT64_MAX / 2;  // past every image if idle
    const int64_t step = threads / cols;
    j = static_cast<int>(t % cols);
    n = first / rows < INT_MAX ? static_cast<int>(first / rows) : INT_MAX;  // idle: loops never
    row = static_cast<int>(first % rows);
    step_n = static_cast<int>(step / rows);
    step_row = static_cast<int>(step % rows);
  }
  __device__ void Next() {
    n += step_n;
    row += step_row;
    if (row >= rows) row -= rows, ++n;
  }
};

// Threads for a RowWalk over rows of `cols` vectors: a wave of resident blocks, rounded down
// to whole rows (at least one row).
template <auto Kernel>
int64_t RowWalkThreads(int cols, int sm_count) {
  const int64_t wave =
      static_cast<int64_t>(std::max(sm_count, 1)) * ResidentBlocks<Kernel>(kThreads) * kThreads;
  return std::max<int64_t>(1, wave / cols) * cols;
}

// One window position of the bf16 max: the 8 values v (4 bf16 pairs) against the running
// maxima acc; where v is greater (an ordered comparison: NaN never wins, as in the float
// form), acc takes v and the channel's argmax byte takes pos (pos4: pos in every byte).
__device__ __forceinline__ void MaxStep(const uint4& v, uint4& acc, uint2& best, uint32_t pos4) {
  uint32_t* a = &acc.x;
  const uint32_t* x = &v.x;
  uint32_t m[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    m[k] = __hgt2_mask(*reinterpret_cast<const __nv_bfloat162*>(&x[k]),
                       *reinterpret_cast<const __nv_bfloat162*>(&a[k]));
    a[k] = (x[k] & m[k]) | (a[k] & ~m[k]);
  }
  // A byte per channel from the pairs' 16-bit masks: bytes 0 and 2 of each.
  const uint32_t b0 = __byte_perm(m[0], m[1], 0x6420), b1 = __byte_perm(m[2], m[3], 0x6420);
  best.x = (pos4 & b0) | (best.x & ~b0);
  best.y = (pos4 & b1) | (best.y & ~b1);
}

template <typename T>
__global__ void MaxPoolForwardVecKernel(PoolShape sh, int64_t threads, const T* __restrict__ x,
                                        T* __restrict__ y, uint8_t* __restrict__ argmax) {
  constexpr int V = kVec<T>;
  const int cv = sh.c / V, ho = sh.ho(), wo = sh.wo();
  RowWalk at(threads, wo * cv, ho);
  const int ow = at.j / cv, cb = (at.j - ow * cv) * V;
  int ws, w0, w1;
  Span(ow, sh.stride_w, sh.pad_w, sh.s, sh.w, &ws, &w0, &w1);
  for (; at.n < sh.n; at.Next()) {
    int hs, h0, h1;
    Span(at.row, sh.stride_h, sh.pad_h, sh.r, sh.h, &hs, &h0, &h1);
    const T* img = x + (static_cast<int64_t>(at.n) * sh.h * sh.w) * sh.c + cb;
    const int64_t o = ((static_cast<int64_t>(at.n) * ho + at.row) * wo + ow) * sh.c + cb;
    const auto first = static_cast<uint8_t>((h0 - hs) * sh.s + (w0 - ws));
    if constexpr (std::is_same_v<T, Bf16>) {
      uint4 acc = make_uint4(0xFF80FF80u, 0xFF80FF80u, 0xFF80FF80u, 0xFF80FF80u);  // -inf
      uint2 best = make_uint2(first * 0x01010101u, first * 0x01010101u);
      for (int ih = h0; ih < h1; ++ih) {
        for (int iw = w0; iw < w1; ++iw) {
          const uint4 v =
              *reinterpret_cast<const uint4*>(img + (static_cast<int64_t>(ih) * sh.w + iw) * sh.c);
          MaxStep(v, acc, best, ((ih - hs) * sh.s + (iw - ws)) * 0x01010101u);
        }
      }
      *reinterpret_cast<uint4*>(y + o) = acc;
      if (argmax != nullptr) *reinterpret_cast<uint2*>(argmax + o) = best;
    } else {
      float acc[V], v[V];
      uint8_t best[V];
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = -FLT_MAX, best[k] = first;
      for (int ih = h0; ih < h1; ++ih) {
        for (int iw = w0; iw < w1; ++iw) {
          LdVec(img + (static_cast<int64_t>(ih) * sh.w + iw) * sh.c, v);
          const auto pos = static_cast<uint8_t>((ih - hs) * sh.s + (iw - ws));
#pragma unroll
          for (int k = 0; k < V; ++k) {
            if (v[k] > acc[k]) acc[k] = v[k], best[k] = pos;
          }
        }
      }
      StVec(y + o, acc);
      if (argmax != nullptr) StoreBytes(argmax + o, best);
    }
  }
}

// The backward kernel's threads each own a kS x kS block of input pixels (kS = 2 where both
// strides are 2, else 1) for one channel vector, and read every window that covers the block
// once: its argmax bytes and its gradient, routed to the block's pixels. 3x3 windows of stride
// 2 are read 4 times per 4 pixels instead of 9 (per pixel the loads, index math and byte
// unpacking were most of the kernel's instructions). Each pixel adds its windows in the scalar
// kernel's order (oh, then ow, ascending): the sums are the same.
template <int kS, typename T>
__global__ void MaxPoolBackwardVecKernel(PoolShape sh, const uint8_t* __restrict__ argmax,
                                         const T* __restrict__ dy, T* __restrict__ dx) {
  constexpr int V = kVec<T>;
  const unsigned cv = sh.c / V, ho = sh.ho(), wo = sh.wo();
  const unsigned bw = (sh.w + kS - 1) / kS, bh = (sh.h + kS - 1) / kS;
  const unsigned total = sh.n * bh * bw * cv;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const unsigned cb = (i % cv) * V;
    unsigned rest = i / cv;
    const int iw0 = rest % bw * kS;
    rest /= bw;
    const int ih0 = rest % bh * kS;
    const unsigned n = rest / bh;
    int oh0, oh1, ow0, ow1;
    Covering(ih0, ih0 + kS - 1, sh.pad_h, sh.r, sh.stride_h, ho, &oh0, &oh1);
    Covering(iw0, iw0 + kS - 1, sh.pad_w, sh.s, sh.stride_w, wo, &ow0, &ow1);
    float g[kS][kS][V] = {};
    for (int oh = oh0; oh <= oh1; ++oh) {
      const int hs = oh * sh.stride_h - sh.pad_h;
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int ws = ow * sh.stride_w - sh.pad_w;
        const size_t o = ((static_cast<size_t>(n) * ho + oh) * wo + ow) * sh.c + cb;
        uint8_t a[V];
        float d[V];
        LoadBytes(argmax + o, a);
        LdVec(dy + o, d);
#pragma unroll
        for (int py = 0; py < kS; ++py) {
#pragma unroll
          for (int px = 0; px < kS; ++px) {
            const int r = ih0 + py - hs, s = iw0 + px - ws;
            if (r < 0 || r >= sh.r || s < 0 || s >= sh.s) continue;  // not in this window
            const int pos = r * sh.s + s;
#pragma unroll
            for (int k = 0; k < V; ++k) {
              if (a[k] == pos) g[py][px][k] += d[k];  // as the scalar kernel: the same sums
            }
          }
        }
      }
    }
#pragma unroll
    for (int py = 0; py < kS; ++py) {
#pragma unroll
      for (int px = 0; px < kS; ++px) {
        if (ih0 + py < sh.h && iw0 + px < sh.w)
          StVec(dx + ((static_cast<size_t>(n) * sh.h + ih0 + py) * sh.w + iw0 + px) * sh.c + cb,
                g[py][px]);
      }
    }
  }
}

// Whether the vector kernels apply (see above).
template <typename T>
bool MaxPoolVecOk(const PoolShape& sh, const void* a, const void* b, const uint8_t* argmax) {
  constexpr int V = kVec<T>;
  const int64_t vectors = static_cast<int64_t>(sh.n) * sh.h * sh.w * (sh.c / V);
  return sh.c % V == 0 && vectors < (int64_t{1} << 31) && Aligned16(a) && Aligned16(b) &&
         (reinterpret_cast<uintptr_t>(argmax) % V) == 0;
}

template <typename T>
__global__ void GlobalAvgForwardKernel(int n, int hw, int c, const T* __restrict__ x,
                                       T* __restrict__ y) {
  TOPIARY_GRID_STRIDE(i, static_cast<int64_t>(n) * c) {
    const int64_t img = i / c;
    const int ch = static_cast<int>(i % c);
    const T* p = x + img * hw * c + ch;
    float s = 0.0f;
    for (int k = 0; k < hw; ++k) s += Ld(p + static_cast<int64_t>(k) * c);
    St(y + i, s / static_cast<float>(hw));
  }
}

template <typename T>
__global__ void GlobalAvgBackwardKernel(int n, int hw, int c, const T* __restrict__ dy,
                                        T* __restrict__ dx) {
  TOPIARY_GRID_STRIDE(i, static_cast<int64_t>(n) * hw * c) {
    const int64_t img = i / (static_cast<int64_t>(hw) * c);
    St(dx + i, Ld(dy + img * c + i % c) / static_cast<float>(hw));
  }
}

int64_t OutCount(const PoolShape& sh) {
  return static_cast<int64_t>(sh.n) * sh.ho() * sh.wo() * sh.c;
}
int64_t InCount(const PoolShape& sh) { return static_cast<int64_t>(sh.n) * sh.h * sh.w * sh.c; }

}  // namespace

absl::Status MaxPoolForwardCuda(DType t, const PoolShape& sh, const void* x, void* y,
                                uint8_t* argmax, const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    if (MaxPoolVecOk<T>(sh, x, y, argmax)) {
      constexpr auto kernel = MaxPoolForwardVecKernel<T>;
      const int64_t threads = RowWalkThreads<kernel>(sh.wo() * (sh.c / kVec<T>), ctx.sm_count);
      kernel<<<static_cast<int>((threads + kThreads - 1) / kThreads), kThreads, 0, ctx.stream>>>(
          sh, threads, static_cast<const T*>(x), static_cast<T*>(y), argmax);
      return;
    }
    PoolForwardKernel<true><<<BlocksFor(OutCount(sh), ctx.sm_count), kThreads, 0, ctx.stream>>>(
        sh, static_cast<const T*>(x), static_cast<T*>(y), argmax);
  });
  return LaunchStatus("max pool forward");
}

absl::Status MaxPoolBackwardCuda(DType t, const PoolShape& sh, const uint8_t* argmax,
                                 const void* dy, void* dx, const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    if (MaxPoolVecOk<T>(sh, dy, dx, argmax)) {
      const int64_t vectors = InCount(sh) / kVec<T>;
      if (sh.stride_h == 2 && sh.stride_w == 2) {
        MaxPoolBackwardVecKernel<2, T>
            <<<BlocksFor(vectors / 4 + 1, ctx.sm_count), kThreads, 0, ctx.stream>>>(
                sh, argmax, static_cast<const T*>(dy), static_cast<T*>(dx));
      } else {
        MaxPoolBackwardVecKernel<1, T>
            <<<BlocksFor(vectors, ctx.sm_count), kThreads, 0, ctx.stream>>>(
                sh, argmax, static_cast<const T*>(dy), static_cast<T*>(dx));
      }
      return;
    }
    PoolBackwardKernel<true><<<BlocksFor(InCount(sh), ctx.sm_count), kThreads, 0, ctx.stream>>>(
        sh, argmax, static_cast<const T*>(dy), static_cast<T*>(dx));
  });
  return LaunchStatus("max pool backward");
}

absl::Status AvgPoolForwardCuda(DType t, const PoolShape& sh, const void* x, void* y,
                                const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    PoolForwardKernel<false><<<BlocksFor(OutCount(sh), ctx.sm_count), kThreads, 0, ctx.stream>>>(
        sh, static_cast<const T*>(x), static_cast<T*>(y), nullptr);
  });
  return LaunchStatus("avg pool forward");
}

absl::Status AvgPoolBackwardCuda(DType t, const PoolShape& sh, const void* dy, void* dx,
                                 const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    PoolBackwardKernel<false><<<BlocksFor(InCount(sh), ctx.sm_count), kThreads, 0, ctx.stream>>>(
        sh, nullptr, static_cast<const T*>(dy), static_cast<T*>(dx));
  });
  return LaunchStatus("avg pool backward");
}

absl::Status GlobalAvgPoolForwardCuda(DType t, int n, int hw, int c, const void* x, void* y,
                                      const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    GlobalAvgForwardKernel<<<BlocksFor(static_cast<int64_t>(n) * c, ctx.sm_count), kThreads, 0,
                             ctx.stream>>>(n, hw, c, static_cast<const T*>(x), static_cast<T*>(y));
  });
  return LaunchStatus("global average pool forward");
}

absl::Status GlobalAvgPoolBackwardCuda(DType t, int n, int hw, int c, const void* dy, void* dx,
                                       const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    GlobalAvgBackwardKernel<<<BlocksFor(static_cast<int64_t>(n) * hw * c, ctx.sm_count), kThreads,
                              0, ctx.stream>>>(n, hw, c, static_cast<const T*>(dy),
                                               static_cast<T*>(dx));
  });
  return LaunchStatus("global average pool backward");
}

}  // namespace topiary::kernels
