// The CUDA entry points of kernels/image in a CPU-only build (see kernels/runtime/no_cuda.h).
#include <cstdlib>

#include "kernels/image/augment.h"
#include "kernels/image/image_lane.h"
#include "kernels/image/jpeg_gpu.h"
#include "kernels/image/resize.h"
#include "kernels/runtime/no_cuda.h"

namespace topiary::kernels {

absl::Status CropResizeCuda(const ResizeJob*, int, int, int, int, uint8_t*, const CudaContext&) {
  return NoCuda();
}
struct ImageLane::Impl {};
ImageLane::ImageLane(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ImageLane::~ImageLane() = default;
absl::StatusOr<std::unique_ptr<ImageLane>> ImageLane::Create(int, int) { return NoCuda(); }
void ImageLane::BindThread() const {}
const CudaContext& ImageLane::context() const { std::abort(); }  // no lane is ever made
absl::Status ImageLane::Upload(void*, const void*, size_t) { return NoCuda(); }
absl::Status ImageLane::Finish() { return NoCuda(); }
absl::Status ImageLane::Consume(int, const CudaContext&, const void*, void*, size_t) {
  return NoCuda();
}
absl::Status ImageLane::WaitConsumed(int) { return NoCuda(); }
struct GpuJpegDecoder::Impl {};
GpuJpegDecoder::GpuJpegDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuJpegDecoder::~GpuJpegDecoder() = default;
absl::StatusOr<std::unique_ptr<GpuJpegDecoder>> GpuJpegDecoder::Create(int) { return NoCuda(); }
const std::string& GpuJpegDecoder::backend() const {
  static const std::string none = "none";
  return none;
}
bool GpuJpegDecoder::Supports(const uint8_t*, size_t, int*, int*) { return false; }
absl::Status GpuJpegDecoder::Decode(const std::vector<const uint8_t*>&, const std::vector<size_t>&,
                                    const std::vector<int>&, const std::vector<uint8_t*>&,
                                    const CudaContext&) {
  return NoCuda();
}
absl::Status AssembleBatchCuda(const AssembleParams&, const StepClock*, const uint8_t*,
                               const int32_t*, const int32_t*, const float*, float*, int32_t*,
                               const CudaContext&) {
  return NoCuda();
}

}  // namespace topiary::kernels
