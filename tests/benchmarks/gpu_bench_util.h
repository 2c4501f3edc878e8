// Helpers shared by the GPU kernel benchmarks: exit on a failed status (naming the program and
// the expression), device allocation, and event timing of a call.
#ifndef TOPIARY_TESTS_BENCHMARKS_GPU_BENCH_UTIL_H_
#define TOPIARY_TESTS_BENCHMARKS_GPU_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "kernels/cuda_context.h"

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
