// The CUDA entry points of kernels/ in a CPU-only build (no toolkit when the build was
// configured). No CUDA device can be created in such a build, so these are unreachable from
// the trainer; they exist so that callers need no preprocessor conditions, and each says
// plainly why it cannot run.
#include "kernels/augment.h"
#include "kernels/batch_norm.h"
#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/pooling.h"
#include "kernels/sgd.h"
#include "kernels/step_clock.h"

namespace topiary::kernels {
namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError("this binary was built without CUDA");
}
}  // namespace

absl::Status CopyCuda(int64_t, const float*, float*, const CudaContext&) { return NoCuda(); }
absl::Status ReluForwardCuda(int64_t, const float*, float*, const CudaContext&) { return NoCuda(); }
absl::Status ReluBackwardCuda(int64_t, const float*, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddCuda(int64_t, const float*, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddReluCuda(int64_t, const float*, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status AddReluBackwardCuda(int64_t, const float*, const float*, float*, float*,
                                 const CudaContext&) {
  return NoCuda();
}
absl::Status AddBiasCuda(int64_t, int, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status BiasGradCuda(int64_t, int, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status SgdStepCuda(int64_t, const SgdParams&, const float*, const float*, const uint8_t*,
                         float*, float*, const CudaContext&) {
  return NoCuda();
}
size_t BatchNormWorkspaceFloatsCuda(const BatchNormShape&) { return 0; }
absl::Status BatchNormForwardTrainCuda(const BatchNormShape&, const float*, const float*,
                                       const float*, float*, float*, float*, float*, float*, float*,
                                       const CudaContext&) {
  return NoCuda();
}
absl::Status BatchNormForwardEvalCuda(const BatchNormShape&, const float*, const float*,
                                      const float*, const float*, const float*, float*,
                                      const CudaContext&) {
  return NoCuda();
}
absl::Status BatchNormBackwardCuda(const BatchNormShape&, const float*, const float*, const float*,
                                   const float*, const float*, const float*, float*, float*, float*,
                                   float*, const CudaContext&) {
  return NoCuda();
}
absl::Status MaxPoolForwardCuda(const PoolShape&, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status MaxPoolBackwardCuda(const PoolShape&, const float*, const float*, const float*, float*,
                                 const CudaContext&) {
  return NoCuda();
}
absl::Status AvgPoolForwardCuda(const PoolShape&, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status AvgPoolBackwardCuda(const PoolShape&, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status GlobalAvgPoolForwardCuda(int, int, int, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status GlobalAvgPoolBackwardCuda(int, int, int, const float*, float*, const CudaContext&) {
  return NoCuda();
}
absl::Status SoftmaxCrossEntropyCuda(int, int, const float*, const int32_t*, float, float*, float*,
                                     int32_t*, const CudaContext&) {
  return NoCuda();
}
absl::Status AccumulateMetricsCuda(int, const float*, const int32_t*, int, double*,
                                   const CudaContext&) {
  return NoCuda();
}
absl::Status LinearForwardCuda(const LinearShape&, const float*, const float*, const float*, float*,
                               const CudaContext&) {
  return NoCuda();
}
absl::Status LinearBackwardDataCuda(const LinearShape&, const float*, const float*, float*,
                                    const CudaContext&) {
  return NoCuda();
}
absl::Status LinearBackwardFilterCuda(const LinearShape&, const float*, const float*, float*,
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
absl::StatusOr<std::unique_ptr<ConvCudaPlan>> ConvCudaPlan::Create(const ConvShape&, ConvMath,
                                                                   size_t, bool,
                                                                   const CudaContext&) {
  return NoCuda();
}
ConvCudaPlan::~ConvCudaPlan() = default;
absl::Status ConvCudaPlan::Forward(const float*, const float*, const float*, float*, void*,
                                   const CudaContext&) const {
  return NoCuda();
}
absl::Status ConvCudaPlan::BackwardData(const float*, const float*, float*, void*,
                                        const CudaContext&) const {
  return NoCuda();
}
absl::Status ConvCudaPlan::BackwardFilter(const float*, const float*, float*, float*, void*,
                                          const CudaContext&) const {
  return NoCuda();
}

}  // namespace topiary::kernels
