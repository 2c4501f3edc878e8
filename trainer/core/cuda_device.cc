// The GPU device: cudaMalloc'd memory, one stream, cuDNN and cuBLAS handles bound to it.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <unordered_map>

#include "absl/strings/str_format.h"
#include "kernels/runtime/cuda_context.h"
#include "trainer/core/device.h"

namespace topiary {
namespace {

class CudaGraph : public CapturedWork {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream)
      : graph_(graph), exec_(exec), stream_(stream) {}
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  absl::Status Replay() override {
    return kernels::CudaStatus(cudaGraphLaunch(exec_, stream_), "replaying the training step");
  }
  int64_t nodes() const override {
    size_t count = 0;
    return cudaGraphGetNodes(graph_, nullptr, &count) == cudaSuccess ? static_cast<int64_t>(count)
                                                                     : 0;
  }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

class CudaDevice : public Device {
 public:
  ~CudaDevice() override {
    kernels::ScopedCudaDevice on(ordinal_);
    if (ctx_.stream) cudaStreamSynchronize(ctx_.stream);
    if (cublas_workspace_) cudaFree(cublas_workspace_);
    if (ctx_.cublas) cublasDestroy(ctx_.cublas);
    if (ctx_.cudnn) cudnnDestroy(ctx_.cudnn);
    if (ctx_.stream) cudaStreamDestroy(ctx_.stream);
  }

  absl::Status Init(int ordinal) {
    ordinal_ = ordinal;
    const std::string where = absl::StrFormat("cuda:%d", ordinal);
    int count = 0;
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(cudaGetDeviceCount(&count), where));
    if (ordinal < 0 || ordinal >= count) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: no such GPU (%d found)", where, count));
    }
    kernels::ScopedCudaDevice on(ordinal);
    cudaDeviceProp prop;
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(cudaGetDeviceProperties(&prop, ordinal), where));
    gpu_name_ = prop.name;
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), ordinal) == cudaSuccess) pci_bus_id_ = bus;
    ctx_.sm_count = prop.multiProcessorCount;
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(
        cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking), where + " stream"));
    TOPIARY_RETURN_IF_ERROR(kernels::CudnnStatus(cudnnCreate(&ctx_.cudnn), where + " cuDNN"));
    TOPIARY_RETURN_IF_ERROR(kernels::CudnnStatus(cudnnSetStream(ctx_.cudnn, ctx_.stream), where));
    TOPIARY_RETURN_IF_ERROR(kernels::CublasStatus(cublasCreate(&ctx_.cublas), where + " cuBLAS"));
    TOPIARY_RETURN_IF_ERROR(
        kernels::CublasStatus(cublasSetStream(ctx_.cublas, ctx_.stream), where));
    // An explicit cuBLAS workspace: cuBLAS then never allocates inside a captured CUDA graph.
    constexpr size_t kCublasWorkspace = 32u << 20;
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(cudaMalloc(&cublas_workspace_, kCublasWorkspace),
                                                where + " cuBLAS workspace"));
    return kernels::CublasStatus(
        cublasSetWorkspace(ctx_.cublas, cublas_workspace_, kCublasWorkspace), where);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return absl::StrFormat("cuda:%d %s", ordinal_, gpu_name_); }
  std::string pci_bus_id() const override { return pci_bus_id_; }
  int ordinal() const override { return ordinal_; }
  void MakeCurrent() override { cudaSetDevice(ordinal_); }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    kernels::ScopedCudaDevice on(ordinal_);
    void* p = nullptr;
    const size_t rounded = (bytes + 255) / 256 * 256;
    const cudaError_t err = cudaMalloc(&p, rounded);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so the process can go on
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "out of GPU memory on %s allocating %.1f MiB (%.1f MiB free of %.1f MiB, %.1f MiB "
          "held by this run)",
          name(), rounded / 1048576.0, free_bytes / 1048576.0, total / 1048576.0,
          allocated_ / 1048576.0));
    }
    cudaMemsetAsync(p, 0, rounded, ctx_.stream);
    allocated_ += rounded;
    sizes_[p] = rounded;
    return p;
  }
  void Free(void* p) override {
    kernels::ScopedCudaDevice on(ordinal_);
    cudaStreamSynchronize(ctx_.stream);
    allocated_ -= sizes_[p];
    sizes_.erase(p);
    cudaFree(p);
  }
  void CopyFromHost(void* dst, const void* src, size_t bytes) override {
    kernels::ScopedCudaDevice on(ordinal_);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx_.stream);
    cudaStreamSynchronize(ctx_.stream);  // src may be a temporary
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    kernels::ScopedCudaDevice on(ordinal_);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream);
    cudaStreamSynchronize(ctx_.stream);
  }
  size_t allocated_bytes() const override { return allocated_; }
  const kernels::CudaContext* cuda() const override { return &ctx_; }
  absl::Status Synchronize() override {
    kernels::ScopedCudaDevice on(ordinal_);
    return kernels::CudaStatus(cudaStreamSynchronize(ctx_.stream), name());
  }
  absl::Status BeginCapture() override {
    return kernels::CudaStatus(
        cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal), "graph capture");
  }
  absl::StatusOr<std::unique_ptr<CapturedWork>> EndCapture() override {
    cudaGraph_t graph = nullptr;
    TOPIARY_RETURN_IF_ERROR(
        kernels::CudaStatus(cudaStreamEndCapture(ctx_.stream, &graph), "graph capture"));
    cudaGraphExec_t exec = nullptr;
    const absl::Status st =
        kernels::CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "graph instantiation");
    if (!st.ok()) {
      cudaGraphDestroy(graph);
      return st;
    }
    return std::unique_ptr<CapturedWork>(new CudaGraph(graph, exec, ctx_.stream));
  }

 private:
  int ordinal_ = 0;
  std::string pci_bus_id_;
  std::string gpu_name_;
  kernels::CudaContext ctx_;
  void* cublas_workspace_ = nullptr;
  size_t allocated_ = 0;
  std::unordered_map<void*, size_t> sizes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal) {
  auto dev = std::make_unique<CudaDevice>();
  TOPIARY_RETURN_IF_ERROR(dev->Init(ordinal));
  dev->MakeCurrent();  // the creating thread launches on it unless it moves on (one GPU)
  return std::unique_ptr<Device>(std::move(dev));
}

}  // namespace topiary
