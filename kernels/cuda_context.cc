#include "kernels/cuda_context.h"

#include "absl/strings/str_cat.h"

namespace topiary::kernels {

absl::Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": CUDA error ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status CudnnStatus(cudnnStatus_t st, const std::string& what) {
  if (st == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": cuDNN error ", cudnnGetErrorString(st));
  if (st == CUDNN_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status CublasStatus(cublasStatus_t st, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": cuBLAS error ", cublasGetStatusName(st), " (",
                                       cublasGetStatusString(st), ")");
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status LaunchStatus(const std::string& kernel) {
  return CudaStatus(cudaGetLastError(), "launching " + kernel);
}

}  // namespace topiary::kernels
