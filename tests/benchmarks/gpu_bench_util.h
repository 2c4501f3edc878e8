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

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_timing.h"
#include "kernels/runtime/dtype.h"

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

// The name of GPU 0, for the benchmarks' JSON lines.
inline std::string GpuName() {
  cudaDeviceProp prop;
  CHECK_OK(CudaStatus(cudaGetDeviceProperties(&prop, 0), "device properties"));
  return prop.name;
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

// Milliseconds per call of f (which exits on failure itself), averaged over `iters` calls
// after a warm-up call: launched from the host one by one, or, with `captured`, captured into a
// CUDA graph and replayed (as the trainer runs a step: without the host's launch work).
template <typename F>
double TimeMs(const CudaContext& cuda, int iters, F f, bool captured = false) {
  const auto run = [&] {
    f();
    return absl::OkStatus();
  };
  auto ms = captured ? TimeCaptured(run, cuda, iters) : TimeOnStream(run, cuda, iters);
  CHECK_OK(ms.status());
  return *ms;
}

// The flags every layer sweep takes: --batch20 (resnet20's layers, default 128), --batch50
// (resnet50's, 256) and --iters (timed calls, 20). Other flags are left to the benchmark.
struct SweepFlags {
  int batch20 = 128, batch50 = 256, iters = 20;
  SweepFlags(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i];
      int* v = k == "--batch20"   ? &batch20
               : k == "--batch50" ? &batch50
               : k == "--iters"   ? &iters
                                  : nullptr;
      if (v != nullptr) (void)absl::SimpleAtoi(argv[i + 1], v);
    }
  }
  int Batch(const ConvLayer& l) const {
    return std::string(l.model) == "resnet20" ? batch20 : batch50;
  }
};

}  // namespace topiary::kernels::bench

#endif  // TOPIARY_TESTS_BENCHMARKS_GPU_BENCH_UTIL_H_
