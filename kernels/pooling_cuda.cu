#include <cfloat>

#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/pooling.h"

namespace topiary::kernels {
namespace {

// Output pixel (oh, ow)'s window, clipped to the image.
__device__ inline void Window(const PoolShape& sh, int oh, int ow, int* h0, int* h1, int* w0,
                              int* w1) {
  const int hs = oh * sh.stride_h - sh.pad_h, ws = ow * sh.stride_w - sh.pad_w;
  *h0 = max(hs, 0);
  *h1 = min(hs + sh.r, sh.h);
  *w0 = max(ws, 0);
  *w1 = min(ws + sh.s, sh.w);
}

// Output windows that contain input row ih: oh in [oh0, oh1].
__device__ inline void Covering(int i, int pad, int k, int stride, int out, int* o0, int* o1) {
  // oh*stride - pad <= i < oh*stride - pad + k
  const int hi = (i + pad) / stride;
  const int lo_num = i + pad - k + 1;
  *o0 = lo_num <= 0 ? 0 : (lo_num + stride - 1) / stride;
  *o1 = min(hi, out - 1);
}

template <bool kMax>
__global__ void PoolForwardKernel(PoolShape sh, const float* __restrict__ x,
                                  float* __restrict__ y) {
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
    const float* img = x + static_cast<int64_t>(n) * sh.h * sh.w * sh.c;
    float acc = kMax ? -FLT_MAX : 0.0f;
    for (int ih = h0; ih < h1; ++ih)
      for (int iw = w0; iw < w1; ++iw) {
        const float v = img[(static_cast<int64_t>(ih) * sh.w + iw) * sh.c + c];
        acc = kMax ? fmaxf(acc, v) : acc + v;
      }
    y[i] = kMax ? acc : acc / static_cast<float>(sh.r * sh.s);
  }
}

template <bool kMax>
__global__ void PoolBackwardKernel(PoolShape sh, const float* __restrict__ x,
                                   const float* __restrict__ y, const float* __restrict__ dy,
                                   float* __restrict__ dx) {
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
    Covering(ih, sh.pad_h, sh.r, sh.stride_h, ho, &oh0, &oh1);
    Covering(iw, sh.pad_w, sh.s, sh.stride_w, wo, &ow0, &ow1);
    const float* img = x + static_cast<int64_t>(n) * sh.h * sh.w * sh.c;
    const int64_t out_base = static_cast<int64_t>(n) * ho * wo;
    float g = 0.0f;
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int64_t o = (out_base + static_cast<int64_t>(oh) * wo + ow) * sh.c + c;
        if (!kMax) {
          g += dy[o];
          continue;
        }
        // Routed here only if this pixel is the window's first maximum in scan order.
        int h0, h1, w0, w1;
        Window(sh, oh, ow, &h0, &h1, &w0, &w1);
        const float m = y[o];
        bool first = false, done = false;
        for (int a = h0; a < h1 && !done; ++a)
          for (int b = w0; b < w1 && !done; ++b) {
            if (img[(static_cast<int64_t>(a) * sh.w + b) * sh.c + c] == m) {
              first = (a == ih && b == iw);
              done = true;
            }
          }
        if (first) g += dy[o];
      }
    dx[i] = kMax ? g : g / static_cast<float>(sh.r * sh.s);
  }
}

__global__ void GlobalAvgForwardKernel(int n, int hw, int c, const float* __restrict__ x,
                                       float* __restrict__ y) {
  TOPIARY_GRID_STRIDE(i, static_cast<int64_t>(n) * c) {
    const int64_t img = i / c;
    const int ch = static_cast<int>(i % c);
    const float* p = x + img * hw * c + ch;
    float s = 0.0f;
    for (int k = 0; k < hw; ++k) s += p[static_cast<int64_t>(k) * c];
    y[i] = s / static_cast<float>(hw);
  }
}

__global__ void GlobalAvgBackwardKernel(int n, int hw, int c, const float* __restrict__ dy,
                                        float* __restrict__ dx) {
  TOPIARY_GRID_STRIDE(i, static_cast<int64_t>(n) * hw * c) {
    const int64_t img = i / (static_cast<int64_t>(hw) * c);
    dx[i] = dy[img * c + i % c] / static_cast<float>(hw);
  }
}

int64_t OutCount(const PoolShape& sh) {
  return static_cast<int64_t>(sh.n) * sh.ho() * sh.wo() * sh.c;
}
int64_t InCount(const PoolShape& sh) { return static_cast<int64_t>(sh.n) * sh.h * sh.w * sh.c; }

}  // namespace

absl::Status MaxPoolForwardCuda(const PoolShape& sh, const float* x, float* y,
                                const CudaContext& ctx) {
  PoolForwardKernel<true>
      <<<BlocksFor(OutCount(sh), ctx.sm_count), kThreads, 0, ctx.stream>>>(sh, x, y);
  return LaunchStatus("max pool forward");
}

absl::Status MaxPoolBackwardCuda(const PoolShape& sh, const float* x, const float* y,
                                 const float* dy, float* dx, const CudaContext& ctx) {
  PoolBackwardKernel<true>
      <<<BlocksFor(InCount(sh), ctx.sm_count), kThreads, 0, ctx.stream>>>(sh, x, y, dy, dx);
  return LaunchStatus("max pool backward");
}

absl::Status AvgPoolForwardCuda(const PoolShape& sh, const float* x, float* y,
                                const CudaContext& ctx) {
  PoolForwardKernel<false>
      <<<BlocksFor(OutCount(sh), ctx.sm_count), kThreads, 0, ctx.stream>>>(sh, x, y);
  return LaunchStatus("avg pool forward");
}

absl::Status AvgPoolBackwardCuda(const PoolShape& sh, const float* dy, float* dx,
                                 const CudaContext& ctx) {
  PoolBackwardKernel<false><<<BlocksFor(InCount(sh), ctx.sm_count), kThreads, 0, ctx.stream>>>(
      sh, nullptr, nullptr, dy, dx);
  return LaunchStatus("avg pool backward");
}

absl::Status GlobalAvgPoolForwardCuda(int n, int hw, int c, const float* x, float* y,
                                      const CudaContext& ctx) {
  GlobalAvgForwardKernel<<<BlocksFor(static_cast<int64_t>(n) * c, ctx.sm_count), kThreads, 0,
                           ctx.stream>>>(n, hw, c, x, y);
  return LaunchStatus("global average pool forward");
}

absl::Status GlobalAvgPoolBackwardCuda(int n, int hw, int c, const float* dy, float* dx,
                                       const CudaContext& ctx) {
  GlobalAvgBackwardKernel<<<BlocksFor(static_cast<int64_t>(n) * hw * c, ctx.sm_count), kThreads, 0,
                            ctx.stream>>>(n, hw, c, dy, dx);
  return LaunchStatus("global average pool backward");
}

}  // namespace topiary::kernels
