#include <array>

#include "kernels/elementwise/activation.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {
namespace {

// Elementwise maps: op reads kIn arrays and writes kOut arrays of T, one element at a time,
// in 16-byte vectors when every pointer allows it (then the tail element by element).
template <typename T, int kIn, int kOut>
struct Arrays {
  const T* in[kIn];
  T* out[kOut];
};

template <typename T, int kIn, int kOut, typename Op>
__global__ void MapKernel(int64_t n, Arrays<T, kIn, kOut> a, bool vec, Op op) {
  constexpr int V = kVec<T>;
  const int64_t nv = vec ? n / V : 0;
  TOPIARY_GRID_STRIDE(j, nv) {
    float x[kIn][V], y[kOut][V];
#pragma unroll
    for (int k = 0; k < kIn; ++k) LdVec(a.in[k] + j * V, x[k]);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float xe[kIn], ye[kOut];
#pragma unroll
      for (int k = 0; k < kIn; ++k) xe[k] = x[k][e];
      op(xe, ye);
#pragma unroll
      for (int k = 0; k < kOut; ++k) y[k][e] = ye[k];
    }
#pragma unroll
    for (int k = 0; k < kOut; ++k) StVec(a.out[k] + j * V, y[k]);
  }
  TOPIARY_GRID_STRIDE(i, n - nv * V) {
    const int64_t t = nv * V + i;
    float xe[kIn], ye[kOut];
#pragma unroll
    for (int k = 0; k < kIn; ++k) xe[k] = Ld(a.in[k] + t);
    op(xe, ye);
#pragma unroll
    for (int k = 0; k < kOut; ++k) St(a.out[k] + t, ye[k]);
  }
}

struct ReluOp {
  __device__ void operator()(const float* x, float* y) const { y[0] = fmaxf(x[0], 0.0f); }
};
struct ReluBackwardOp {  // (y, dy) -> dx
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] > 0.0f ? x[1] : 0.0f; }
};
struct Relu6Op {
  __device__ void operator()(const float* x, float* y) const {
    y[0] = fminf(fmaxf(x[0], 0.0f), 6.0f);
  }
};
struct Relu6BackwardOp {  // (y, dy) -> dx
  __device__ void operator()(const float* x, float* y) const {
    y[0] = x[0] > 0.0f && x[0] < 6.0f ? x[1] : 0.0f;
  }
};
struct AddOp {
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] + x[1]; }
};
struct AddReluOp {
  __device__ void operator()(const float* x, float* y) const { y[0] = fmaxf(x[0] + x[1], 0.0f); }
};
struct AddReluBackwardOp {  // (y, dy) -> (da, db)
  __device__ void operator()(const float* x, float* y) const {
    y[0] = y[1] = x[0] > 0.0f ? x[1] : 0.0f;
  }
};
struct AddReluBackwardSumOp {  // (y, dy, dy2) -> (da, db)
  __device__ void operator()(const float* x, float* y) const {
    y[0] = y[1] = x[0] > 0.0f ? x[1] + x[2] : 0.0f;
  }
};

template <int kIn, int kOut, typename Op>
absl::Status Map(DType t, int64_t n, const std::array<const void*, kIn>& in,
                 const std::array<void*, kOut>& out, Op op, const CudaContext& ctx,
                 const char* what) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    Arrays<T, kIn, kOut> a;
    bool vec = true;
    for (int k = 0; k < kIn; ++k) {
      a.in[k] = static_cast<const T*>(in[k]);
      vec = vec && Aligned16(in[k]);
    }
    for (int k = 0; k < kOut; ++k) {
      a.out[k] = static_cast<T*>(out[k]);
      vec = vec && Aligned16(out[k]);
    }
    const int64_t work = vec ? n / kVec<T> + kVec<T> : n;
    MapKernel<<<BlocksFor(work, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, a, vec, op);
  });
  return LaunchStatus(what);
}

// Copies [rows, width] between a narrow tensor and columns [offset, offset + width) of a wide
// one ([rows, wide_width]): wide <- narrow (concat), or narrow <- wide (kSplit, its
// backward). One thread per element, consecutive threads along a row.
template <typename T, bool kSplit>
__global__ void ChannelsKernel(int64_t rows, int width, int wide_width, int offset,
                               const T* __restrict__ src, T* __restrict__ dst) {
  TOPIARY_GRID_STRIDE(i, rows * width) {
    const int64_t row = i / width;
    const int64_t w = row * wide_width + offset + (i - row * width);
    if (kSplit) {
      dst[i] = src[w];
    } else {
      dst[w] = src[i];
    }
  }
}

template <bool kSplit>
absl::Status Channels(DType t, int64_t rows, int width, int wide_width, int offset, const void* src,
                      void* dst, const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    ChannelsKernel<T, kSplit><<<BlocksFor(rows * width, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        rows, width, wide_width, offset, static_cast<const T*>(src), static_cast<T*>(dst));
  });
  return LaunchStatus(kSplit ? "channel split" : "channel concat");
}

template <typename From, typename To>
__global__ void CastKernel(int64_t n, const From* __restrict__ src, To* __restrict__ dst) {
  TOPIARY_GRID_STRIDE(i, n) { St(dst + i, Ld(src + i)); }
}

// blockIdx.y picks the table entry; the x blocks stride over it.
template <typename From, typename To>
__global__ void CastManyKernel(const CastItem* items) {
  const CastItem it = items[blockIdx.y];
  const From* src = static_cast<const From*>(it.src);
  To* dst = static_cast<To*>(it.dst);
  TOPIARY_GRID_STRIDE(i, it.n) { St(dst + i, Ld(src + i)); }
}

template <typename T>
__global__ void AddBiasKernel(int64_t n, int c, const float* bias, T* y) {
  TOPIARY_GRID_STRIDE(i, n) { St(y + i, Ld(y + i) + bias[i % c]); }
}

// One block per column: threads sum strided rows, then a fixed binary tree in shared memory
// combines them (deterministic; a convolution's bias has 10^5 rows, too many for one thread).
constexpr int kColumnThreads = 256;

template <typename T>
__global__ void BiasGradKernel(int64_t rows, int c, const T* __restrict__ dy,
                               float* __restrict__ db) {
  const int j = blockIdx.x;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += kColumnThreads) s += Ld(dy + i * c + j);
  __shared__ float part[kColumnThreads];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kColumnThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[j] = part[0];
}

// Runs fn(From{}, To{}) for the one conversion that changes type; copies are refused.
template <typename Fn>
absl::Status VisitCast(DType from, DType to, Fn&& fn) {
  if (from == DType::kF32 && to == DType::kBf16) {
    fn(float{}, Bf16{});
  } else if (from == DType::kBf16 && to == DType::kF32) {
    fn(Bf16{}, float{});
  } else if (from == DType::kF32 && to == DType::kF32) {
    fn(float{}, float{});  // a plain copy: gathers and scatters of fp32 gradients
  } else {
    return absl::InvalidArgumentError("cast: bf16 to bf16 is not a conversion");
  }
  return absl::OkStatus();
}

struct ActivationOp {
  ActivationFn p;
  __device__ void operator()(const float* x, float* y) const { y[0] = ActivationOf(p, x[0]); }
};
struct ActivationBackwardOp {  // (x, dy) -> dx
  ActivationFn p;
  __device__ void operator()(const float* x, float* y) const {
    y[0] = x[1] * ActivationSlope(p, x[0]);
  }
};
struct MulOp {
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] * x[1]; }
};
struct MulBackwardOp {  // (a, b, dy) -> (da, db)
  __device__ void operator()(const float* x, float* y) const {
    y[0] = x[2] * x[1];
    y[1] = x[2] * x[0];
  }
};

// y = a * b[image, channel] over [rows, c], rows = images * pixels (a squeeze-and-excitation
// scale; da = dy * b is the same product).
template <typename T>
__global__ void ChannelScaleKernel(int64_t rows, int c, int pixels, const T* __restrict__ a,
                                   const T* __restrict__ b, T* __restrict__ y) {
  TOPIARY_GRID_STRIDE(i, rows * c) {
    const int64_t row = i / c;
    const int j = static_cast<int>(i - row * c);
    St(y + i, Ld(a + i) * Ld(b + (row / pixels) * c + j));
  }
}

// db[image, channel] = sum over the image's pixels of dy * a: one thread per (image,
// channel), consecutive threads on consecutive channels (coalesced NHWC reads), in order.
template <typename T>
__global__ void ChannelScaleGradKernel(int64_t images, int c, int pixels, const T* __restrict__ a,
                                       const T* __restrict__ dy, T* __restrict__ db) {
  TOPIARY_GRID_STRIDE(k, images * c) {
    const int64_t n = k / c;
    const int j = static_cast<int>(k - n * c);
    float s = 0.0f;
    for (int64_t p = 0; p < pixels; ++p) {
      const int64_t i = (n * pixels + p) * c + j;
      s = fmaf(Ld(dy + i), Ld(a + i), s);
    }
    St(db + k, s);
  }
}

}  // namespace

absl::Status ActivationForwardCuda(DType t, const ActivationFn& p, int64_t n, const void* x,
                                   void* y, const CudaContext& ctx) {
  return Map<1, 1>(t, n, {x}, {y}, ActivationOp{p}, ctx, "activation forward");
}

absl::Status ActivationBackwardCuda(DType t, const ActivationFn& p, int64_t n, const void* x,
                                    const void* dy, void* dx, const CudaContext& ctx) {
  return Map<2, 1>(t, n, {x, dy}, {dx}, ActivationBackwardOp{p}, ctx, "activation backward");
}

absl::Status MulForwardCuda(DType t, int64_t rows, int c, int pixels_per_image, const void* a,
                            const void* b, void* y, const CudaContext& ctx) {
  if (pixels_per_image == 0) return Map<2, 1>(t, rows * c, {a, b}, {y}, MulOp{}, ctx, "mul");
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    ChannelScaleKernel<<<BlocksFor(rows * c, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        rows, c, pixels_per_image, static_cast<const T*>(a), static_cast<const T*>(b),
        static_cast<T*>(y));
  });
  return LaunchStatus("channel scale");
}

absl::Status MulBackwardCuda(DType t, int64_t rows, int c, int pixels_per_image, const void* a,
                             const void* b, const void* dy, void* da, void* db,
                             const CudaContext& ctx) {
  const int64_t n = rows * c;
  if (pixels_per_image == 0) {
    if (da != nullptr && db != nullptr) {
      return Map<3, 2>(t, n, {a, b, dy}, {da, db}, MulBackwardOp{}, ctx, "mul backward");
    }
    if (da != nullptr) TOPIARY_RETURN_IF_ERROR(MulForwardCuda(t, rows, c, 0, dy, b, da, ctx));
    if (db != nullptr) TOPIARY_RETURN_IF_ERROR(MulForwardCuda(t, rows, c, 0, dy, a, db, ctx));
    return absl::OkStatus();
  }
  if (da != nullptr) {
    TOPIARY_RETURN_IF_ERROR(MulForwardCuda(t, rows, c, pixels_per_image, dy, b, da, ctx));
  }
  if (db == nullptr) return absl::OkStatus();
  const int64_t images = rows / pixels_per_image;
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    ChannelScaleGradKernel<<<BlocksFor(images * c, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        images, c, pixels_per_image, static_cast<const T*>(a), static_cast<const T*>(dy),
        static_cast<T*>(db));
  });
  return LaunchStatus("channel scale backward");
}

absl::Status CopyCuda(int64_t bytes, const void* src, void* dst, const CudaContext& ctx) {
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx.stream),
                    "device copy");
}

absl::Status ReluForwardCuda(DType t, int64_t n, const void* x, void* y, const CudaContext& ctx) {
  return Map<1, 1>(t, n, {x}, {y}, ReluOp{}, ctx, "relu forward");
}

absl::Status ReluBackwardCuda(DType t, int64_t n, const void* y, const void* dy, void* dx,
                              const CudaContext& ctx) {
  return Map<2, 1>(t, n, {y, dy}, {dx}, ReluBackwardOp{}, ctx, "relu backward");
}

absl::Status Relu6ForwardCuda(DType t, int64_t n, const void* x, void* y, const CudaContext& ctx) {
  return Map<1, 1>(t, n, {x}, {y}, Relu6Op{}, ctx, "relu6 forward");
}

absl::Status Relu6BackwardCuda(DType t, int64_t n, const void* y, const void* dy, void* dx,
                               const CudaContext& ctx) {
  return Map<2, 1>(t, n, {y, dy}, {dx}, Relu6BackwardOp{}, ctx, "relu6 backward");
}

absl::Status ConcatChannelsCuda(DType t, int64_t rows, int width, int wide_width, int offset,
                                const void* narrow, void* wide, const CudaContext& ctx) {
  return Channels<false>(t, rows, width, wide_width, offset, narrow, wide, ctx);
}

absl::Status SplitChannelsCuda(DType t, int64_t rows, int width, int wide_width, int offset,
                               const void* wide, void* narrow, const CudaContext& ctx) {
  return Channels<true>(t, rows, width, wide_width, offset, wide, narrow, ctx);
}

absl::Status AddCuda(DType t, int64_t n, const void* a, const void* b, void* y,
                     const CudaContext& ctx) {
  return Map<2, 1>(t, n, {a, b}, {y}, AddOp{}, ctx, "add");
}

absl::Status AddReluCuda(DType t, int64_t n, const void* a, const void* b, void* y,
                         const CudaContext& ctx) {
  return Map<2, 1>(t, n, {a, b}, {y}, AddReluOp{}, ctx, "add+relu");
}

absl::Status AddReluBackwardCuda(DType t, int64_t n, const void* y, const void* dy, void* da,
                                 void* db, const CudaContext& ctx) {
  return Map<2, 2>(t, n, {y, dy}, {da, db}, AddReluBackwardOp{}, ctx, "add+relu backward");
}

absl::Status AddReluBackwardSumCuda(DType t, int64_t n, const void* y, const void* dy,
                                    const void* dy2, void* da, void* db, const CudaContext& ctx) {
  return Map<3, 2>(t, n, {y, dy, dy2}, {da, db}, AddReluBackwardSumOp{}, ctx,
                   "add+relu backward with a second gradient");
}

absl::Status CastCuda(DType from, DType to, int64_t n, const void* src, void* dst,
                      const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(VisitCast(from, to, [&](auto f, auto t) {
    using From = decltype(f);
    using To = decltype(t);
    CastKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        n, static_cast<const From*>(src), static_cast<To*>(dst));
  }));
  return LaunchStatus("cast");
}

absl::Status CastManyCuda(DType from, DType to, const CastItem* items, int count,
                          const CudaContext& ctx) {
  if (count == 0) return absl::OkStatus();
  TOPIARY_RETURN_IF_ERROR(VisitCast(from, to, [&](auto f, auto t) {
    using From = decltype(f);
    using To = decltype(t);
    // A few blocks per entry: the entries are weights, from hundreds to millions of values.
    const dim3 grid(std::max(1, ctx.sm_count / 4), count);
    CastManyKernel<From, To><<<grid, kThreads, 0, ctx.stream>>>(items);
  }));
  return LaunchStatus("cast weights");
}

// One thread per element sums the rows in row order: the bits do not depend on the grid.
__global__ void MeanRowsKernel(int rows, int64_t n, const float* __restrict__ src,
                               float* __restrict__ dst) {
  const float scale = 1.0f / rows;
  TOPIARY_GRID_STRIDE(i, n) {
    float s = src[i];
    for (int r = 1; r < rows; ++r) s += src[r * n + i];
    dst[i] = s * scale;
  }
}

absl::Status MeanRowsCuda(int rows, int64_t n, const float* src, float* dst,
                          const CudaContext& ctx) {
  if (n == 0) return absl::OkStatus();
  MeanRowsKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(rows, n, src, dst);
  return LaunchStatus("mean of rows");
}

absl::Status AddBiasCuda(DType t, int64_t rows, int c, const float* bias, void* y,
                         const CudaContext& ctx) {
  const int64_t n = rows * c;
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    AddBiasKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(n, c, bias,
                                                                           static_cast<T*>(y));
  });
  return LaunchStatus("bias add");
}

absl::Status BiasGradCuda(DType t, int64_t rows, int c, const void* dy, float* db,
                          const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    BiasGradKernel<<<c, kColumnThreads, 0, ctx.stream>>>(rows, c, static_cast<const T*>(dy), db);
  });
  return LaunchStatus("bias gradient");
}

// Zeros per thread over a grid-stride loop, summed per warp, one atomic add per warp (integer
// sums: the order does not matter).
template <typename T>
__global__ void CountZerosKernel(int64_t n, const T* __restrict__ x,
                                 unsigned long long* __restrict__ count) {
  unsigned long long zeros = 0;
  TOPIARY_GRID_STRIDE(i, n) zeros += Ld(x + i) == 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) zeros += __shfl_down_sync(~0u, zeros, offset);
  if ((threadIdx.x & 31) == 0 && zeros > 0) atomicAdd(count, zeros);
}

absl::Status CountZerosCuda(DType t, int64_t n, const void* x, unsigned long long* count,
                            const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    CountZerosKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        n, static_cast<const T*>(x), count);
  });
  return LaunchStatus("zero count");
}

}  // namespace topiary::kernels
