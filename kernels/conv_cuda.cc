// Convolutions through cuDNN's convolution API. It is deprecated in cuDNN 9 in favour of the
// graph API but still supported, and it is the direct way to time and pick one algorithm per
// pass at plan time; hence the local warning suppression.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/conv.h"
#include "kernels/cuda_context.h"
#include "kernels/elementwise.h"

namespace topiary::kernels {

struct ConvCudaPlan::Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
};

namespace {

std::string Describe(const ConvShape& s) {
  return absl::StrFormat("conv [%d,%d,%d,%d] * [%d,%d,%d,%d] stride %d pad %d", s.n, s.h, s.w, s.c,
                         s.k, s.r, s.s, s.c, s.stride_h, s.pad_h);
}

// The fastest result (cuDNN sorts them by time) that succeeded, fits the workspace limit
// and, when asked, is deterministic.
template <typename Perf>
absl::StatusOr<Perf> Pick(const std::vector<Perf>& results, int count, size_t limit,
                          bool deterministic, const std::string& what) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = results[i];
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= limit &&
        (!deterministic || p.determinism == CUDNN_DETERMINISTIC)) {
      return p;
    }
  }
  return absl::InternalError(what + ": cuDNN found no usable algorithm");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConvCudaPlan>> ConvCudaPlan::Create(const ConvShape& sh,
                                                                   ConvMath math,
                                                                   size_t workspace_limit,
                                                                   bool deterministic,
                                                                   const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckConvShape(sh));
  std::unique_ptr<ConvCudaPlan> plan(new ConvCudaPlan());
  plan->shape_ = sh;
  plan->d_ = std::make_unique<Descriptors>();
  Descriptors& d = *plan->d_;
  const std::string what = Describe(sh);
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateTensorDescriptor(&d.x), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateTensorDescriptor(&d.y), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateFilterDescriptor(&d.w), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateConvolutionDescriptor(&d.conv), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, sh.n, sh.c, sh.h, sh.w),
      what));
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, sh.n, sh.k,
                                             sh.ho(), sh.wo()),
                  what));
  // CUDNN_TENSOR_NHWC for a filter means [K, R, S, C]: the engine's layout.
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetFilter4dDescriptor(d.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, sh.k, sh.c, sh.r, sh.s),
      what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetConvolution2dDescriptor(d.conv, sh.pad_h, sh.pad_w, sh.stride_h, sh.stride_w, 1, 1,
                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
      what));
  // FMA math forbids TF32 (which cuDNN's default math allows on Ampere and later).
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetConvolutionMathType(
                      d.conv, math == ConvMath::kFp32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH),
                  what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(ctx.cudnn, ctx.stream), what));

  constexpr int kMaxAlgos = 16;
  int count = 0;
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionForwardAlgorithm(ctx.cudnn, d.x, d.w, d.conv, d.y, kMaxAlgos,
                                                       &count, fwd.data()),
                  what + " (forward algorithm search)"));
  auto f = Pick(fwd, count, workspace_limit, deterministic, what + " forward");
  if (!f.ok()) return f.status();
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bd(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionBackwardDataAlgorithm(ctx.cudnn, d.w, d.y, d.conv, d.x,
                                                            kMaxAlgos, &count, bd.data()),
                  what + " (backward-data algorithm search)"));
  auto b = Pick(bd, count, workspace_limit, deterministic, what + " backward data");
  if (!b.ok()) return b.status();
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bf(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionBackwardFilterAlgorithm(ctx.cudnn, d.x, d.y, d.conv, d.w,
                                                              kMaxAlgos, &count, bf.data()),
                  what + " (backward-filter algorithm search)"));
  auto g = Pick(bf, count, workspace_limit, deterministic, what + " backward filter");
  if (!g.ok()) return g.status();
  d.fwd = f->algo;
  d.bwd_data = b->algo;
  d.bwd_filter = g->algo;
  plan->workspace_bytes_ = std::max({f->memory, b->memory, g->memory});
  return plan;
}

ConvCudaPlan::~ConvCudaPlan() {
  if (!d_) return;
  cudnnDestroyTensorDescriptor(d_->x);
  cudnnDestroyTensorDescriptor(d_->y);
  cudnnDestroyFilterDescriptor(d_->w);
  cudnnDestroyConvolutionDescriptor(d_->conv);
}

absl::Status ConvCudaPlan::Forward(const float* x, const float* w, const float* bias, float* y,
                                   void* workspace, const CudaContext& ctx) const {
  const float one = 1.0f, zero = 0.0f;
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnConvolutionForward(ctx.cudnn, &one, d_->x, x, d_->w, w, d_->conv, d_->fwd,
                                          workspace, workspace_bytes_, &zero, d_->y, y),
                  Describe(shape_) + " forward"));
  if (bias == nullptr) return absl::OkStatus();
  return AddBiasCuda(static_cast<int64_t>(shape_.n) * shape_.ho() * shape_.wo(), shape_.k, bias, y,
                     ctx);
}

absl::Status ConvCudaPlan::BackwardData(const float* dy, const float* w, float* dx, void* workspace,
                                        const CudaContext& ctx) const {
  const float one = 1.0f, zero = 0.0f;
  return CudnnStatus(
      cudnnConvolutionBackwardData(ctx.cudnn, &one, d_->w, w, d_->y, dy, d_->conv, d_->bwd_data,
                                   workspace, workspace_bytes_, &zero, d_->x, dx),
      Describe(shape_) + " backward data");
}

absl::Status ConvCudaPlan::BackwardFilter(const float* x, const float* dy, float* dw, float* dbias,
                                          void* workspace, const CudaContext& ctx) const {
  const float one = 1.0f, zero = 0.0f;
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnConvolutionBackwardFilter(ctx.cudnn, &one, d_->x, x, d_->y, dy, d_->conv, d_->bwd_filter,
                                     workspace, workspace_bytes_, &zero, d_->w, dw),
      Describe(shape_) + " backward filter"));
  if (dbias == nullptr) return absl::OkStatus();
  return BiasGradCuda(static_cast<int64_t>(shape_.n) * shape_.ho() * shape_.wo(), shape_.k, dy,
                      dbias, ctx);
}

}  // namespace topiary::kernels
