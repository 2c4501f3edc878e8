#include "trainer/nn/sparse_dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/cuda_timing.h"
#include "util/status_macros.h"

namespace topiary {

BlockSparseMode EffectiveSparseMode(BlockSparseMode planned) {
  const char* env = std::getenv("TOPIARY_SPARSE_CONV");
  if (env != nullptr && std::strcmp(env, "off") == 0) return BlockSparseMode::kOff;
  if (env != nullptr && std::strcmp(env, "on") == 0) return BlockSparseMode::kOn;
  return planned;
}

bool SparseDispatchEnabled(bool gpu, bool deterministic, BlockSparseMode mode) {
  return gpu && mode != BlockSparseMode::kOff && (!deterministic || mode == BlockSparseMode::kOn);
}

SparseConvDispatch::SparseConvDispatch(std::string layer, kernels::ConvShape shape,
                                       kernels::DType dtype, BlockSparseMode mode)
    : layer_(std::move(layer)), shape_(shape), dtype_(dtype), mode_(mode) {}

absl::Status SparseConvDispatch::Replan(const Parameter& kernel, const kernels::CudaContext& ctx) {
  plan_.reset();
  choice_ = SparseConvChoice{};
  for (bool& m : measured_) m = false;
  version_ = kernel.mask_version;
  const MaskInfo& info = kernel.mask_info;
  if (info.kind != MaskInfo::Kind::kBlock) return absl::OkStatus();
  const kernels::BlockGrid& grid = info.blocks;
  auto plan = kernels::BlockSparseConvCuda::Create(shape_, grid, dtype_, ctx);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(layer_, ": block-sparse plan: ", plan.status().message()));
  }
  plan_ = std::move(*plan);
  choice_.density = grid.density();
  return absl::OkStatus();
}

namespace {

// Whether the call asks for the batch norm's moments: a forward without a bias, with a route.
bool MomentsAsked(kernels::SparsePass pass, const float* bias,
                  const SparseConvDispatch::MomentsRequest* request) {
  return pass == kernels::SparsePass::kForward && request != nullptr && request->route != nullptr &&
         bias == nullptr;
}

}  // namespace

absl::Status SparseConvDispatch::RunSparse(kernels::SparsePass pass, const void* in0,
                                           const void* in1, void* out, const float* bias,
                                           float* dbias, float* moments,
                                           const kernels::CudaContext& ctx) {
  switch (pass) {
    case kernels::SparsePass::kForward:
      return plan_->Forward(in0, in1, bias, out, ctx, moments);
    case kernels::SparsePass::kBackwardData:
      return plan_->BackwardData(in0, in1, out, ctx);
    case kernels::SparsePass::kBackwardFilter:
      return plan_->BackwardFilter(in0, in1, out, dbias, ctx);
  }
  return absl::InternalError("unknown pass");
}

int SparseConvDispatch::MomentSlices(const MomentsRequest& request,
                                     const kernels::CudaContext& ctx) const {
  // Where the configuration writes the moments (Hopper's) and they fit the route's buffer (it
  // has room for any Hopper configuration's slices).
  const int n = plan_->forward_moment_slices(ctx);
  return n > 0 && n <= request.route->slices() ? n : 0;
}

absl::Status SparseConvDispatch::Measure(kernels::SparsePass pass, const void* in0, const void* in1,
                                         void* out, const float* bias, float* dbias,
                                         const std::function<absl::Status()>& dense,
                                         const kernels::CudaContext& ctx,
                                         const MomentsRequest* request) {
  using kernels::SparsePass;
  const int p = static_cast<int>(pass);
  if (mode_ == BlockSparseMode::kOn) {  // forced: no timing
    choice_.sparse[p] = true;
    choice_.config[p] = plan_->config_name(pass);
    choice_.dense_ms[p] = choice_.sparse_ms[p] = 0;
    return absl::OkStatus();
  }
  // Where the filter gradient has only the plain kernel (no Hopper kernel takes the grid), it
  // loses to cuDNN on every layer measured (docs/PERFORMANCE.md), and one run of it on a large
  // layer takes longer than a training step: it runs only when forced.
  if (pass == SparsePass::kBackwardFilter && plan_->configs(pass) == 1) return absl::OkStatus();
  // The sparse kernel's tile configurations are compared call by call, then the chosen one and
  // cuDNN's plan as captured graphs (cuDNN's host-side cost per call would otherwise count
  // against it, though a captured step never pays it).
  TOPIARY_RETURN_IF_ERROR(plan_->Tune(pass, in0, in1, out, ctx).status());
  choice_.config[p] = plan_->config_name(pass);
  // With the moments asked for, both sides with the batch norm's statistics: the route measures
  // itself on its first call (running the pass; its output is overwritten after), and the
  // block-sparse forward pays a pass over y where its configuration writes no moments.
  float dense_ms = -1;
  if (MomentsAsked(pass, bias, request)) {
    TOPIARY_RETURN_IF_ERROR(
        request->route->Run(in0, in1, out, request->workspace, request->moments, dense, ctx)
            .status());
    dense_ms = request->route->route_ms();  // negative when the route is forced: untimed
  }
  const bool with_statistics = dense_ms >= 0;
  if (pass == SparsePass::kForward) choice_.forward_with_statistics = with_statistics;
  absl::StatusOr<float> sparse_ms;
  if (with_statistics) {
    // The block-sparse forward writes the moments where its configuration can (mine.slices >
    // 0), else the statistics pass reads y.
    float* const part = request->route->part();
    const kernels::BatchNormMoments mine{part, MomentSlices(*request, ctx)};
    float* const written = mine.slices > 0 ? part : nullptr;
    sparse_ms = request->route->TimeWithStatistics(
        [&] { return RunSparse(pass, in0, in1, out, bias, dbias, written, ctx); }, out,
        written != nullptr ? &mine : nullptr, request->workspace, ctx);
  } else {
    TOPIARY_ASSIGN_OR_RETURN(dense_ms, kernels::TimeCaptured(dense, ctx));
    sparse_ms = kernels::TimeCaptured(
        [&] { return RunSparse(pass, in0, in1, out, bias, dbias, nullptr, ctx); }, ctx, 10);
  }
  if (!sparse_ms.ok()) return sparse_ms.status();
  choice_.dense_ms[p] = dense_ms;
  choice_.sparse_ms[p] = *sparse_ms;
  choice_.sparse[p] = *sparse_ms < dense_ms;
  if (kernels::ConvLogEnabled()) {
    std::fprintf(stderr,
                 "%s %s: %.1f%% of blocks kept: block-sparse %.4f ms (%s), dense %.4f ms%s, "
                 "chose %s\n",
                 layer_.c_str(), kernels::SparsePassName(pass), 100.0 * choice_.density, *sparse_ms,
                 choice_.config[p].c_str(), dense_ms,
                 with_statistics ? " (both with the batch norm's statistics)" : "",
                 choice_.sparse[p] ? "block-sparse" : "dense");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> SparseConvDispatch::Run(kernels::SparsePass pass, const Parameter& kernel,
                                             const void* in0, const void* in1, void* out,
                                             const float* bias, float* dbias,
                                             const std::function<absl::Status()>& dense,
                                             const kernels::CudaContext& ctx,
                                             const MomentsRequest* request) {
  if (pass == kernels::SparsePass::kForward) wrote_moments_ = false;
  // The dense side: with the moments asked for, the layer's moments route (true when it ran
  // the pass: it wrote the moments), else the caller's cuDNN pass (false). Masked weights are
  // zeros, so either is right for any mask.
  const bool moments_asked = MomentsAsked(pass, bias, request);
  auto dense_route = [&]() -> absl::StatusOr<bool> {
    if (!moments_asked) return false;
    return request->route->Run(in0, in1, out, request->workspace, request->moments, dense, ctx);
  };
  if (kernel.mask_info.kind != MaskInfo::Kind::kBlock && plan_ == nullptr) return dense_route();
  const bool capturing = kernels::StreamCapturing(ctx);
  if (kernel.mask_version != version_) {
    if (capturing) return dense_route();  // not planned for this mask: dense is correct for any
    TOPIARY_RETURN_IF_ERROR(Replan(kernel, ctx));
  }
  if (plan_ == nullptr) return dense_route();
  const int p = static_cast<int>(pass);
  if (!measured_[p]) {
    if (capturing) return dense_route();
    measured_[p] = true;
    TOPIARY_RETURN_IF_ERROR(Measure(pass, in0, in1, out, bias, dbias, dense, ctx, request));
  }
  if (!choice_.sparse[p]) return dense_route();
  // The block-sparse forward writes the moments into the route's buffer where it can.
  const int slices = moments_asked ? MomentSlices(*request, ctx) : 0;
  float* part = slices > 0 ? request->route->part() : nullptr;
  TOPIARY_RETURN_IF_ERROR(RunSparse(pass, in0, in1, out, bias, dbias, part, ctx));
  if (slices > 0) {
    *request->moments = kernels::BatchNormMoments{part, slices};
    wrote_moments_ = true;
  }
  return true;
}

}  // namespace topiary
