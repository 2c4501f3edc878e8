// The CUDA entry points of kernels/ in a CPU-only build (no toolkit when the build was
// configured). No CUDA device can be created in such a build, so these are unreachable from
// the trainer; they exist so that callers need no preprocessor conditions, and each says
// plainly why it cannot run.
#include <cstdlib>

#include "kernels/approx_conv.h"
#include "kernels/augment.h"
#include "kernels/batch_norm.h"
#include "kernels/block_sparse_conv.h"
#include "kernels/conv.h"
#include "kernels/cuda_timing.h"
#include "kernels/elementwise.h"
#include "kernels/grouped_conv.h"
#include "kernels/image_lane.h"
#include "kernels/jpeg_gpu.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/pooling.h"
#include "kernels/resize.h"
#include "kernels/sampled_grad.h"
#include "kernels/sgd.h"
#include "kernels/step_clock.h"

namespace topiary::kernels {
namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError("this binary was built without CUDA");
}
}  // namespace

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

absl::Status CopyCuda(int64_t, const void*, void*, const CudaContext&) { return NoCuda(); }
absl::Status ReluForwardCuda(DType, int64_t, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status ReluBackwardCuda(DType, int64_t, const void*, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status Relu6ForwardCuda(DType, int64_t, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status Relu6BackwardCuda(DType, int64_t, const void*, const void*, void*,
                               const CudaContext&) {
  return NoCuda();
}
absl::Status ConcatChannelsCuda(DType, int64_t, int, int, int, const void*, void*,
                                const CudaContext&) {
  return NoCuda();
}
absl::Status SplitChannelsCuda(DType, int64_t, int, int, int, const void*, void*,
                               const CudaContext&) {
  return NoCuda();
}
absl::Status GroupedConvForwardCuda(DType, const GroupedConvShape&, const void*, const float*,
                                    const float*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status GroupedConvBackwardDataCuda(DType, const GroupedConvShape&, const void*, const float*,
                                         void*, const CudaContext&) {
  return NoCuda();
}
absl::Status GroupedConvBackwardFilterCuda(DType, const GroupedConvShape&, const void*, const void*,
                                           float*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddCuda(DType, int64_t, const void*, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddReluCuda(DType, int64_t, const void*, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddReluBackwardCuda(DType, int64_t, const void*, const void*, void*, void*,
                                 const CudaContext&) {
  return NoCuda();
}
absl::Status AddReluBackwardSumCuda(DType, int64_t, const void*, const void*, const void*, void*,
                                    void*, const CudaContext&) {
  return NoCuda();
}
absl::Status CastCuda(DType, DType, int64_t, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status CastManyCuda(DType, DType, const CastItem*, int, const CudaContext&) {
  return NoCuda();
}
absl::Status MeanRowsCuda(int, int64_t, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddBiasCuda(DType, int64_t, int, const float*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status CountZerosCuda(DType, int64_t, const void*, unsigned long long*, const CudaContext&) {
  return NoCuda();
}
absl::Status BiasGradCuda(DType, int64_t, int, const void*, float*, const CudaContext&) {
  return NoCuda();
}
absl::StatusOr<float> TimeOnStream(const std::function<absl::Status()>&, const CudaContext&, int,
                                   bool) {
  return NoCuda();
}
absl::StatusOr<float> TimeCaptured(const std::function<absl::Status()>&, const CudaContext&, int) {
  return NoCuda();
}
bool StreamCapturing(const CudaContext&) { return false; }

struct BlockSparseConvCuda::Device {};
absl::StatusOr<std::unique_ptr<BlockSparseConvCuda>> BlockSparseConvCuda::Create(
    const ConvShape&, const BlockGrid&, DType, const CudaContext&) {
  return NoCuda();
}
BlockSparseConvCuda::~BlockSparseConvCuda() = default;
int BlockSparseConvCuda::configs(SparsePass) const { return 0; }
absl::Status BlockSparseConvCuda::set_config(SparsePass, int) { return NoCuda(); }
std::string BlockSparseConvCuda::config_name(SparsePass) const { return "unavailable"; }
absl::Status BlockSparseConvCuda::Run(SparsePass, int, const void*, const void*, void*,
                                      const float*, float*, const CudaContext&) const {
  return NoCuda();
}
absl::Status BlockSparseConvCuda::Forward(const void*, const void*, const float*, void*,
                                          const CudaContext&) const {
  return NoCuda();
}
absl::Status BlockSparseConvCuda::BackwardData(const void*, const void*, void*,
                                               const CudaContext&) const {
  return NoCuda();
}
absl::Status BlockSparseConvCuda::BackwardFilter(const void*, const void*, void*, float*,
                                                 const CudaContext&) const {
  return NoCuda();
}
absl::StatusOr<float> BlockSparseConvCuda::Tune(SparsePass, const void*, const void*, void*,
                                                const CudaContext&) {
  return NoCuda();
}
size_t SampledWeightGradWorkspaceBytes(const ConvShape&, int) { return 0; }
absl::Status SampledWeightGradCuda(DType, const ConvShape&, const WeightGradSampling&, const void*,
                                   const void*, const uint8_t*, void*, float*, void*,
                                   const CudaContext&) {
  return NoCuda();
}
absl::Status SgdStepCuda(const SgdParams&, const float*, const std::vector<SgdTensor>&,
                         const CudaContext&) {
  return NoCuda();
}
size_t BatchNormWorkspaceFloatsCuda(const BatchNormShape&) { return 0; }
absl::Status BatchNormForwardTrainCuda(DType, const BatchNormShape&, const void*, const float*,
                                       const float*, float*, float*, float*, float*, void*, float*,
                                       const CudaContext&) {
  return NoCuda();
}
absl::Status BatchNormForwardEvalCuda(DType, const BatchNormShape&, const void*, const float*,
                                      const float*, const float*, const float*, void*,
                                      const CudaContext&) {
  return NoCuda();
}
absl::Status BatchNormBackwardCuda(DType, const BatchNormShape&, const void*, const void*,
                                   const void*, const float*, const float*, const float*, void*,
                                   float*, float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status MaxPoolForwardCuda(DType, const PoolShape&, const void*, void*, uint8_t*,
                                const CudaContext&) {
  return NoCuda();
}
absl::Status MaxPoolBackwardCuda(DType, const PoolShape&, const uint8_t*, const void*, void*,
                                 const CudaContext&) {
  return NoCuda();
}
absl::Status AvgPoolForwardCuda(DType, const PoolShape&, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status AvgPoolBackwardCuda(DType, const PoolShape&, const void*, void*, const CudaContext&) {
  return NoCuda();
}
absl::Status GlobalAvgPoolForwardCuda(DType, int, int, int, const void*, void*,
                                      const CudaContext&) {
  return NoCuda();
}
absl::Status GlobalAvgPoolBackwardCuda(DType, int, int, int, const void*, void*,
                                       const CudaContext&) {
  return NoCuda();
}
absl::Status SoftmaxCrossEntropyCuda(DType, int, int, const void*, const int32_t*, float, void*,
                                     float*, int32_t*, const CudaContext&) {
  return NoCuda();
}
absl::Status AccumulateMetricsCuda(int, const float*, const int32_t*, int, double*,
                                   const CudaContext&) {
  return NoCuda();
}
absl::Status LinearForwardCuda(DType, const LinearShape&, const void*, const void*, const float*,
                               void*, const CudaContext&) {
  return NoCuda();
}
absl::Status LinearBackwardDataCuda(DType, const LinearShape&, const void*, const void*, void*,
                                    const CudaContext&) {
  return NoCuda();
}
absl::Status LinearBackwardFilterCuda(DType, const LinearShape&, const void*, const void*, void*,
                                      float*, const CudaContext&) {
  return NoCuda();
}
absl::Status TickCuda(StepClock*, const float*, int, const CudaContext&) { return NoCuda(); }
absl::Status AssembleBatchCuda(const AssembleParams&, const StepClock*, const uint8_t*,
                               const int32_t*, const int32_t*, const float*, float*, int32_t*,
                               const CudaContext&) {
  return NoCuda();
}

struct ConvCudaPlan::Descriptors {};
absl::StatusOr<std::unique_ptr<ConvCudaPlan>> ConvCudaPlan::Create(const ConvShape&, Precision,
                                                                   size_t, bool, const CudaContext&,
                                                                   const ConvSearch&) {
  return NoCuda();
}
std::string ConvDeviceIdentity(const CudaContext&) { return ""; }
ConvCudaPlan::~ConvCudaPlan() = default;
absl::Status ConvCudaPlan::RunPass(int, const void*, const void*, void*, void*,
                                   const CudaContext&) const {
  return NoCuda();
}
absl::Status ConvCudaPlan::Forward(const void*, const void*, const float*, void*, void*,
                                   const CudaContext&) const {
  return NoCuda();
}
absl::Status ConvCudaPlan::BackwardData(const void*, const void*, void*, void*,
                                        const CudaContext&) const {
  return NoCuda();
}
absl::Status ConvCudaPlan::BackwardFilter(const void*, const void*, void*, float*, void*,
                                          const CudaContext&) const {
  return NoCuda();
}

size_t ApproxConvWorkspaceBytes(const ConvShape&) { return 0; }
absl::Status ApproxConvPrepareCuda() { return NoCuda(); }
absl::Status ApproxConv2dForwardCuda(const ConvShape&, const float*, const float*, const float*,
                                     const uint16_t*, float*, float*, float*, QuantParams*, void*,
                                     const CudaContext&, const ApproxConvOptions&) {
  return NoCuda();
}

}  // namespace topiary::kernels
