#include "kernels/image/image_lane.h"

#include <vector>

#include "kernels/runtime/cuda_context.h"
#include "util/status_macros.h"

namespace topiary::kernels {

struct ImageLane::Impl {
  int ordinal = 0;
  CudaContext ctx;
  std::vector<cudaEvent_t> consumed;
  ~Impl() {
    ScopedCudaDevice on(ordinal);
    if (ctx.stream != nullptr) cudaStreamSynchronize(ctx.stream);
    for (cudaEvent_t e : consumed) cudaEventDestroy(e);
    if (ctx.stream != nullptr) cudaStreamDestroy(ctx.stream);
  }
};

ImageLane::ImageLane(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ImageLane::~ImageLane() = default;

absl::StatusOr<std::unique_ptr<ImageLane>> ImageLane::Create(int ordinal, int slots) {
  ScopedCudaDevice on(ordinal);
  auto impl = std::make_unique<Impl>();
  impl->ordinal = ordinal;
  TOPIARY_RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&impl->ctx.stream, cudaStreamNonBlocking), "image lane stream"));
  for (int s = 0; s < slots; ++s) {
    cudaEvent_t e = nullptr;
    TOPIARY_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "image lane event"));
    impl->consumed.push_back(e);
  }
  return std::unique_ptr<ImageLane>(new ImageLane(std::move(impl)));
}

void ImageLane::BindThread() const { cudaSetDevice(impl_->ordinal); }

const CudaContext& ImageLane::context() const { return impl_->ctx; }

absl::Status ImageLane::Upload(void* device, const void* host, size_t bytes) {
  return CudaStatus(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, impl_->ctx.stream),
                    "image upload");
}

absl::Status ImageLane::Finish() {
  return CudaStatus(cudaStreamSynchronize(impl_->ctx.stream), "image decoding");
}

absl::Status ImageLane::Consume(int slot, const CudaContext& compute, const void* src, void* dst,
                                size_t bytes) {
  TOPIARY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute.stream), "batch copy"));
  return CudaStatus(cudaEventRecord(impl_->consumed[slot], compute.stream), "batch copy event");
}

absl::Status ImageLane::WaitConsumed(int slot) {
  return CudaStatus(cudaEventSynchronize(impl_->consumed[slot]), "batch copy");
}

}  // namespace topiary::kernels
