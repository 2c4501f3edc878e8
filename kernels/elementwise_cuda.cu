#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/elementwise.h"

namespace topiary::kernels {
namespace {

template <typename T>
__global__ void ReluForwardKernel(int64_t n, const T* __restrict__ x, T* __restrict__ y) {
  TOPIARY_GRID_STRIDE(i, n) { St(y + i, fmaxf(Ld(x + i), 0.0f)); }
}

template <typename T>
__global__ void ReluBackwardKernel(int64_t n, const T* y, const T* dy, T* dx) {
  TOPIARY_GRID_STRIDE(i, n) { St(dx + i, Ld(y + i) > 0.0f ? Ld(dy + i) : 0.0f); }
}

template <typename T>
__global__ void AddKernel(int64_t n, const T* a, const T* b, T* y) {
  TOPIARY_GRID_STRIDE(i, n) { St(y + i, Ld(a + i) + Ld(b + i)); }
}

template <typename T>
__global__ void AddReluKernel(int64_t n, const T* a, const T* b, T* y) {
  TOPIARY_GRID_STRIDE(i, n) { St(y + i, fmaxf(Ld(a + i) + Ld(b + i), 0.0f)); }
}

template <typename T>
__global__ void AddReluBackwardKernel(int64_t n, const T* y, const T* dy, T* da, T* db) {
  TOPIARY_GRID_STRIDE(i, n) {
    const float g = Ld(y + i) > 0.0f ? Ld(dy + i) : 0.0f;
    St(da + i, g);
    St(db + i, g);
  }
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
  } else {
    return absl::InvalidArgumentError("cast: source and destination types are the same");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyCuda(int64_t bytes, const void* src, void* dst, const CudaContext& ctx) {
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx.stream),
                    "device copy");
}

absl::Status ReluForwardCuda(DType t, int64_t n, const void* x, void* y, const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    ReluForwardKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        n, static_cast<const T*>(x), static_cast<T*>(y));
  });
  return LaunchStatus("relu forward");
}

absl::Status ReluBackwardCuda(DType t, int64_t n, const void* y, const void* dy, void* dx,
                              const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    ReluBackwardKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        n, static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx));
  });
  return LaunchStatus("relu backward");
}

absl::Status AddCuda(DType t, int64_t n, const void* a, const void* b, void* y,
                     const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    AddKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        n, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y));
  });
  return LaunchStatus("add");
}

absl::Status AddReluCuda(DType t, int64_t n, const void* a, const void* b, void* y,
                         const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    AddReluKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        n, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y));
  });
  return LaunchStatus("add+relu");
}

absl::Status AddReluBackwardCuda(DType t, int64_t n, const void* y, const void* dy, void* da,
                                 void* db, const CudaContext& ctx) {
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    AddReluBackwardKernel<<<BlocksFor(n, ctx.sm_count), kThreads, 0, ctx.stream>>>(
        n, static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(da),
        static_cast<T*>(db));
  });
  return LaunchStatus("add+relu backward");
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

}  // namespace topiary::kernels
