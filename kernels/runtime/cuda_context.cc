#include "kernels/runtime/cuda_context.h"

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

int CurrentComputeCapability() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

absl::StatusOr<float> TimeOnStream(const std::function<absl::Status()>& run, const CudaContext& ctx,
                                   int runs, bool warmup) {
  if (warmup) TOPIARY_RETURN_IF_ERROR(run());
  cudaEvent_t start, stop;
  TOPIARY_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "timing"));
  if (auto st = CudaStatus(cudaEventCreate(&stop), "timing"); !st.ok()) {
    cudaEventDestroy(start);
    return st;
  }
  cudaEventRecord(start, ctx.stream);
  absl::Status st;
  for (int i = 0; i < runs && st.ok(); ++i) st = run();
  cudaEventRecord(stop, ctx.stream);
  const cudaError_t err = cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!st.ok()) return st;
  TOPIARY_RETURN_IF_ERROR(CudaStatus(err, "timing"));
  return ms / runs;
}

absl::StatusOr<float> TimeCaptured(const std::function<absl::Status()>& run, const CudaContext& ctx,
                                   int runs) {
  TOPIARY_RETURN_IF_ERROR(run());
  TOPIARY_RETURN_IF_ERROR(CudaStatus(
      cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal), "timing capture"));
  absl::Status st;
  for (int i = 0; i < runs && st.ok(); ++i) st = run();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(ctx.stream, &graph);
  if (!st.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return st;
  }
  TOPIARY_RETURN_IF_ERROR(CudaStatus(end, "timing capture"));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TOPIARY_RETURN_IF_ERROR(CudaStatus(inst, "timing capture"));
  auto launch = [&] { return CudaStatus(cudaGraphLaunch(exec, ctx.stream), "timing replay"); };
  auto ms = TimeOnStream(launch, ctx, 3);
  cudaGraphExecDestroy(exec);
  if (!ms.ok()) return ms.status();
  return *ms / runs;
}

bool StreamCapturing(const CudaContext& ctx) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(ctx.stream, &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

}  // namespace topiary::kernels
