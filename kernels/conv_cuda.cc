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
  // One convolution descriptor per pass: each carries the math type its algorithm was
  // measured with (cuDNN refuses to run an algorithm under another math type).
  cudnnConvolutionDescriptor_t conv_fwd = nullptr, conv_bwd_data = nullptr,
                               conv_bwd_filter = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
};

namespace {

std::string Describe(const ConvShape& s) {
  return absl::StrFormat("conv [%d,%d,%d,%d] * [%d,%d,%d,%d] stride %d pad %d", s.n, s.h, s.w, s.c,
                         s.k, s.r, s.s, s.c, s.stride_h, s.pad_h);
}

// The fastest result (cuDNN sorts them by time) that succeeded, fits the workspace limit,
// is deterministic when asked, and in fp32 uses plain FMA math (no TF32).
template <typename Perf>
absl::StatusOr<Perf> Pick(const std::vector<Perf>& results, int count, size_t limit,
                          bool deterministic, bool fma_only, const std::string& what) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = results[i];
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= limit &&
        (!deterministic || p.determinism == CUDNN_DETERMINISTIC) &&
        (!fma_only || p.mathType == CUDNN_FMA_MATH)) {
      return p;
    }
  }
  return absl::InternalError(what + ": cuDNN found no usable algorithm");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConvCudaPlan>> ConvCudaPlan::Create(const ConvShape& sh,
                                                                   Precision precision,
                                                                   size_t workspace_limit,
                                                                   bool deterministic,
                                                                   const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckConvShape(sh));
  std::unique_ptr<ConvCudaPlan> plan(new ConvCudaPlan());
  plan->shape_ = sh;
  plan->dtype_ = ActivationType(precision);
  const cudnnDataType_t data =
      plan->dtype_ == DType::kBf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  plan->d_ = std::make_unique<Descriptors>();
  Descriptors& d = *plan->d_;
  const std::string what = Describe(sh);
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateTensorDescriptor(&d.x), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateTensorDescriptor(&d.y), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateFilterDescriptor(&d.w), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NHWC, data, sh.n, sh.c, sh.h, sh.w),
      what));
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NHWC, data, sh.n, sh.k,
                                             sh.ho(), sh.wo()),
                  what));
  // CUDNN_TENSOR_NHWC for a filter means [K, R, S, C]: the engine's layout.
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetFilter4dDescriptor(d.w, data, CUDNN_TENSOR_NHWC, sh.k, sh.c, sh.r, sh.s),
      what));
  // Compute type fp32 (accumulation) for every precision. FMA math forbids TF32 (which
  // cuDNN's default math allows on Ampere and later); bf16 searches tensor-core algorithms.
  const cudnnMathType_t math = precision == Precision::kFp32   ? CUDNN_FMA_MATH
                               : precision == Precision::kTf32 ? CUDNN_DEFAULT_MATH
                                                               : CUDNN_TENSOR_OP_MATH;
  for (cudnnConvolutionDescriptor_t* c : {&d.conv_fwd, &d.conv_bwd_data, &d.conv_bwd_filter}) {
    TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateConvolutionDescriptor(c), what));
    TOPIARY_RETURN_IF_ERROR(CudnnStatus(
        cudnnSetConvolution2dDescriptor(*c, sh.pad_h, sh.pad_w, sh.stride_h, sh.stride_w, 1, 1,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        what));
    TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolutionMathType(*c, math), what));
  }
  const bool fma_only = precision == Precision::kFp32;
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(ctx.cudnn, ctx.stream), what));

  constexpr int kMaxAlgos = 16;
  int count = 0;
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionForwardAlgorithm(ctx.cudnn, d.x, d.w, d.conv_fwd, d.y, kMaxAlgos,
                                                       &count, fwd.data()),
                  what + " (forward algorithm search)"));
  auto f = Pick(fwd, count, workspace_limit, deterministic, fma_only, what + " forward");
  if (!f.ok()) return f.status();
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bd(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionBackwardDataAlgorithm(ctx.cudnn, d.w, d.y, d.conv_bwd_data, d.x,
                                                            kMaxAlgos, &count, bd.data()),
                  what + " (backward-data algorithm search)"));
  auto b = Pick(bd, count, workspace_limit, deterministic, fma_only, what + " backward data");
  if (!b.ok()) return b.status();
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bf(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionBackwardFilterAlgorithm(ctx.cudnn, d.x, d.y, d.conv_bwd_filter, d.w,
                                                              kMaxAlgos, &count, bf.data()),
                  what + " (backward-filter algorithm search)"));
  auto g = Pick(bf, count, workspace_limit, deterministic, fma_only, what + " backward filter");
  if (!g.ok()) return g.status();
  d.fwd = f->algo;
  d.bwd_data = b->algo;
  d.bwd_filter = g->algo;
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolutionMathType(d.conv_fwd, f->mathType), what));
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetConvolutionMathType(d.conv_bwd_data, b->mathType), what));
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetConvolutionMathType(d.conv_bwd_filter, g->mathType), what));
  plan->workspace_bytes_ = std::max({f->memory, b->memory, g->memory});
  return plan;
}

ConvCudaPlan::~ConvCudaPlan() {
  if (!d_) return;
  cudnnDestroyTensorDescriptor(d_->x);
  cudnnDestroyTensorDescriptor(d_->y);
  cudnnDestroyFilterDescriptor(d_->w);
  cudnnDestroyConvolutionDescriptor(d_->conv_fwd);
  cudnnDestroyConvolutionDescriptor(d_->conv_bwd_data);
  cudnnDestroyConvolutionDescriptor(d_->conv_bwd_filter);
}

absl::Status ConvCudaPlan::Forward(const void* x, const void* w, const float* bias, void* y,
                                   void* workspace, const CudaContext& ctx) const {
  const float one = 1.0f, zero = 0.0f;
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnConvolutionForward(ctx.cudnn, &one, d_->x, x, d_->w, w, d_->conv_fwd, d_->fwd,
                                          workspace, workspace_bytes_, &zero, d_->y, y),
                  Describe(shape_) + " forward"));
  if (bias == nullptr) return absl::OkStatus();
  return AddBiasCuda(dtype_, static_cast<int64_t>(shape_.n) * shape_.ho() * shape_.wo(), shape_.k,
                     bias, y, ctx);
}

absl::Status ConvCudaPlan::BackwardData(const void* dy, const void* w, void* dx, void* workspace,
                                        const CudaContext& ctx) const {
  const float one = 1.0f, zero = 0.0f;
  return CudnnStatus(
      cudnnConvolutionBackwardData(ctx.cudnn, &one, d_->w, w, d_->y, dy, d_->conv_bwd_data,
                                   d_->bwd_data,
                                   workspace, workspace_bytes_, &zero, d_->x, dx),
      Describe(shape_) + " backward data");
}

absl::Status ConvCudaPlan::BackwardFilter(const void* x, const void* dy, void* dw, float* dbias,
                                          void* workspace, const CudaContext& ctx) const {
  const float one = 1.0f, zero = 0.0f;
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnConvolutionBackwardFilter(ctx.cudnn, &one, d_->x, x, d_->y, dy, d_->conv_bwd_filter,
                                     d_->bwd_filter,
                                     workspace, workspace_bytes_, &zero, d_->w, dw),
      Describe(shape_) + " backward filter"));
  if (dbias == nullptr) return absl::OkStatus();
  return BiasGradCuda(dtype_, static_cast<int64_t>(shape_.n) * shape_.ho() * shape_.wo(), shape_.k,
                      dy, dbias, ctx);
}

}  // namespace topiary::kernels
