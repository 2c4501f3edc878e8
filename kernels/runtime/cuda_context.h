// What CUDA kernels need besides pointers and shapes: the stream they run on and the library
// handles bound to it. Owned by the CUDA Device (trainer/), passed down explicitly (no global
// stream state). Also the helpers that turn CUDA, cuDNN and cuBLAS errors into Status.
#ifndef TOPIARY_KERNELS_RUNTIME_CUDA_CONTEXT_H_
#define TOPIARY_KERNELS_RUNTIME_CUDA_CONTEXT_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "absl/status/status.h"
#include "kernels/runtime/cuda_timing.h"
#include "util/status_macros.h"

namespace topiary::kernels {

struct CudaContext {
  cudaStream_t stream = nullptr;
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  int sm_count = 0;  // streaming multiprocessors: sizes grids of reduction kernels
};

// Makes `ordinal` the calling thread's current device for a scope and restores the caller's
// afterwards: a GPU's resources are made and freed on it without moving the thread (which may
// be another rank's) to another GPU.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int ordinal) {
    cudaGetDevice(&previous_);
    switched_ = previous_ != ordinal;
    if (switched_) cudaSetDevice(ordinal);
  }
  ~ScopedCudaDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// OK for cudaSuccess; otherwise an error naming `what` and CUDA's message. Out-of-memory
// becomes RESOURCE_EXHAUSTED so callers can tell it apart.
absl::Status CudaStatus(cudaError_t err, const std::string& what);
absl::Status CudnnStatus(cudnnStatus_t st, const std::string& what);
absl::Status CublasStatus(cublasStatus_t st, const std::string& what);
// The error of the last kernel launch (cudaGetLastError), named by `kernel`.
absl::Status LaunchStatus(const std::string& kernel);

// The current device's compute capability as major * 10 + minor (90 on H100/H200), or 0 when
// there is no device or CUDA cannot say (the error is cleared).
int CurrentComputeCapability();

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_CUDA_CONTEXT_H_
