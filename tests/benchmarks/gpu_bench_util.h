// Helpers shared by the GPU kernel benchmarks: exit on a failed status (naming the program and
// the expression), device allocation, and event timing of a call.
#ifndef TOPIARY_TESTS_BENCHMARKS_GPU_BENCH_UTIL_H_
#define TOPIARY_TESTS_BENCHMARKS_GPU_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/conv.h"
#include "kernels/cuda_context.h"
#include "kernels/dtype.h"

namespace topiary::kernels::bench {

// Set by each benchmark's main to its name, for error messages.
inline const char* program = "bench";

#define CHECK_OK(expr)                                                                 \
  do {                                                                                 \
    const absl::Status st_ = (expr);                                                   \
    if (!st_.ok()) {                                                                   \
      absl::FPrintF(stderr, "%s: %s: %s\n", ::topiary::kernels::bench::program, #expr, \
                    st_.ToString());                                                   \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

inline void* DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  CHECK_OK(CudaStatus(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc"));
  return p;
}

// n standard-normal elements of type t (dY gets a spread of magnitudes, as gradients do).
inline void* RandomDevice(DType t, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> f(n);
  for (auto& v : f) v = d(gen);
  void* p = DeviceAlloc(n * SizeOf(t));
  if (t == DType::kF32) {
    cudaMemcpy(p, f.data(), n * 4, cudaMemcpyHostToDevice);
  } else {
    std::vector<Bf16> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = ToBf16(f[i]);
    cudaMemcpy(p, b.data(), n * 2, cudaMemcpyHostToDevice);
  }
  return p;
}

// A stream with a cuDNN handle bound to it, and the SM count.
inline CudaContext MakeContext() {
  CudaContext cuda;
  CHECK_OK(CudaStatus(cudaStreamCreate(&cuda.stream), "stream"));
  CHECK_OK(CudnnStatus(cudnnCreate(&cuda.cudnn), "cudnn"));
  CHECK_OK(CudnnStatus(cudnnSetStream(cuda.cudnn, cuda.stream), "cudnn stream"));
  cudaDeviceGetAttribute(&cuda.sm_count, cudaDevAttrMultiProcessorCount, 0);
  return cuda;
}

// A convolution layer of a zoo model: square input of side hw, square filter r, "same"
// padding.
struct ConvLayer {
  const char* model;
  const char* name;
  int hw, c, k, r, stride;

  ConvShape Shape(int batch) const {
    ConvShape s;
    s.n = batch;
    s.h = s.w = hw;
    s.c = c;
    s.k = k;
    s.r = s.s = r;
    s.stride_h = s.stride_w = stride;
    s.pad_h = s.pad_w = r / 2;
    return s;
  }
};

// Milliseconds per call of f, averaged over `iters` calls after two warm-up calls.
template <typename F>
double TimeMs(const CudaContext& cuda, int iters, F f) {
  for (int i = 0; i < 2; ++i) f();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, cuda.stream);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(stop, cuda.stream);
  CHECK_OK(CudaStatus(cudaEventSynchronize(stop), "timing"));
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

}  // namespace topiary::kernels::bench

#endif  // TOPIARY_TESTS_BENCHMARKS_GPU_BENCH_UTIL_H_
