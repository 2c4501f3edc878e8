// Direct grouped convolution: one thread per output element (forward), per input element
// (backward data), and one block per filter weight (backward filter, a fixed-order tree
// over the batch's pixels).
#include "kernels/conv/grouped_conv.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {
namespace {

template <typename T>
__global__ void ForwardKernel(GroupedConvShape g, const T* __restrict__ x,
                              const float* __restrict__ w, const float* __restrict__ bias,
                              T* __restrict__ y) {
  const ConvShape s = g.conv;
  const int ho = s.ho(), wo = s.wo(), cg = g.cg(), kg = g.kg();
  TOPIARY_GRID_STRIDE(i, static_cast<int64_t>(s.n) * ho * wo * s.k) {
    const int k = static_cast<int>(i % s.k);
    const int64_t pix = i / s.k;
    const int q = static_cast<int>(pix % wo), p = static_cast<int>(pix / wo % ho);
    const int64_t n = pix / (static_cast<int64_t>(wo) * ho);
    float acc = bias ? bias[k] : 0.0f;
    for (int r = 0; r < s.r; ++r)
      for (int t = 0; t < s.s; ++t) {
        int h, col;
        if (!g.Tap(p, q, r, t, &h, &col)) continue;
        const T* in = x + g.In(n, h, col, (k / kg) * cg);
        const float* f = w + g.Filter(k, r, t, 0);
        for (int c = 0; c < cg; ++c) acc += Ld(in + c) * f[c];
      }
    St(y + i, acc);
  }
}

// The inverse of Tap: the output pixels that read input (h, col) are those with
// p * stride = h + pad - r for some tap r (and the same across), so each thread gathers.
template <typename T>
__global__ void BackwardDataKernel(GroupedConvShape g, const T* __restrict__ dy,
                                   const float* __restrict__ w, T* __restrict__ dx) {
  const ConvShape s = g.conv;
  const int ho = s.ho(), wo = s.wo(), cg = g.cg(), kg = g.kg();
  TOPIARY_GRID_STRIDE(i, static_cast<int64_t>(s.n) * s.h * s.w * s.c) {
    const int c = static_cast<int>(i % s.c);
    const int64_t pix = i / s.c;
    const int col = static_cast<int>(pix % s.w), h = static_cast<int>(pix / s.w % s.h);
    const int64_t n = pix / (static_cast<int64_t>(s.w) * s.h);
    const int group = c / cg, ci = c - group * cg;
    float acc = 0;
    for (int r = 0; r < s.r; ++r) {
      const int ph = h + s.pad_h - r;
      if (ph < 0 || ph % s.stride_h != 0 || ph / s.stride_h >= ho) continue;
      for (int t = 0; t < s.s; ++t) {
        const int qw = col + s.pad_w - t;
        if (qw < 0 || qw % s.stride_w != 0 || qw / s.stride_w >= wo) continue;
        const int64_t out = g.Out(n, ph / s.stride_h, qw / s.stride_w, group * kg);
        for (int k = 0; k < kg; ++k) {
          acc += Ld(dy + out + k) * w[g.Filter(group * kg + k, r, t, ci)];
        }
      }
    }
    St(dx + i, acc);
  }
}

constexpr int kFilterThreads = 256;

// Block b computes weight b = (k, r, t, ci): its threads take the batch's output pixels in
// strides, then a fixed binary tree in shared memory sums them.
template <typename T>
__global__ void BackwardFilterKernel(GroupedConvShape g, const T* __restrict__ x,
                                     const T* __restrict__ dy, float* __restrict__ dw) {
  const ConvShape s = g.conv;
  const int ho = s.ho(), wo = s.wo(), cg = g.cg(), kg = g.kg();
  const int64_t b = blockIdx.x;
  const int ci = static_cast<int>(b % cg);
  const int t = static_cast<int>(b / cg % s.s), r = static_cast<int>(b / cg / s.s % s.r);
  const int k = static_cast<int>(b / (static_cast<int64_t>(cg) * s.s * s.r));
  const int c = (k / kg) * cg + ci;
  float acc = 0;
  const int64_t pixels = static_cast<int64_t>(s.n) * ho * wo;
  for (int64_t j = threadIdx.x; j < pixels; j += kFilterThreads) {
    const int q = static_cast<int>(j % wo), p = static_cast<int>(j / wo % ho);
    const int64_t n = j / (static_cast<int64_t>(wo) * ho);
    int h, col;
    if (!g.Tap(p, q, r, t, &h, &col)) continue;
    acc += Ld(dy + j * s.k + k) * Ld(x + g.In(n, h, col, c));
  }
  __shared__ float part[kFilterThreads];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kFilterThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) dw[b] = part[0];
}

}  // namespace

absl::Status GroupedConvForwardCuda(DType t, const GroupedConvShape& g, const void* x,
                                    const float* w, const float* bias, void* y,
                                    const CudaContext& ctx) {
  const int64_t n = static_cast<int64_t>(g.conv.n) * g.conv.ho() * g.conv.wo() * g.conv.k;
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    ForwardKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        g, static_cast<const T*>(x), w, bias, static_cast<T*>(y));
  });
  return LaunchStatus("grouped conv forward");
}

absl::Status GroupedConvBackwardDataCuda(DType t, const GroupedConvShape& g, const void* dy,
                                         const float* w, void* dx, const CudaContext& ctx) {
  const int64_t n = static_cast<int64_t>(g.conv.n) * g.conv.h * g.conv.w * g.conv.c;
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    BackwardDataKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        g, static_cast<const T*>(dy), w, static_cast<T*>(dx));
  });
  return LaunchStatus("grouped conv backward data");
}

absl::Status GroupedConvBackwardFilterCuda(DType t, const GroupedConvShape& g, const void* x,
                                           const void* dy, float* dw, const CudaContext& ctx) {
  const int64_t weights = static_cast<int64_t>(g.conv.k) * g.conv.r * g.conv.s * g.cg();
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    BackwardFilterKernel<<<static_cast<unsigned>(weights), kFilterThreads, 0, ctx.stream>>>(
        g, static_cast<const T*>(x), static_cast<const T*>(dy), dw);
  });
  return LaunchStatus("grouped conv backward filter");
}

}  // namespace topiary::kernels
