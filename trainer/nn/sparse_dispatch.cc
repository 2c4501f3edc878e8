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

absl::StatusOr<bool> SparseConvDispatch::Run(kernels::SparsePass pass, const Parameter& kernel,
                                             const void* in0, const void* in1, void* out,
                                             const float* bias, float* dbias,
                                             const std::function<absl::Status()>& dense,
                                             const kernels::CudaContext& ctx,
                                             const MomentsRequest* request) {
  using kernels::SparsePass;
  if (pass == SparsePass::kForward) wrote_moments_ = false;
  // The dense side: with the moments asked for, the layer's moments route (true when it ran
  // the pass: it wrote the moments), else the caller's cuDNN pass (false). Masked weights are
  // zeros, so either is right for any mask.
  const bool moments_asked = pass == SparsePass::kForward && request != nullptr &&
                             request->route != nullptr && bias == nullptr;
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
  auto sparse = [&]() -> absl::Status {
    switch (pass) {
      case SparsePass::kForward:
        return plan_->Forward(in0, in1, bias, out, ctx);
      case SparsePass::kBackwardData:
        return plan_->BackwardData(in0, in1, out, ctx);
      case SparsePass::kBackwardFilter:
        return plan_->BackwardFilter(in0, in1, out, dbias, ctx);
    }
    return absl::InternalError("unknown pass");
  };
  // The block-sparse forward writing the moments into the route's buffer, where its
  // configuration writes them (Hopper's) and they fit (the buffer has room for any Hopper
  // configuration's slices): mine.slices > 0.
  float* part = moments_asked ? request->route->part() : nullptr;
  kernels::BatchNormMoments mine{part, 0};
  auto with_moments = [&]() -> absl::Status {
    return plan_->Forward(in0, in1, nullptr, out, ctx, part);
  };
  auto moment_slices = [&] {
    const int n = moments_asked ? plan_->forward_moment_slices(ctx) : 0;
    return n > 0 && n <= request->route->slices() ? n : 0;
  };
  const int p = static_cast<int>(pass);
  if (!measured_[p]) {
    if (capturing) return dense_route();
    measured_[p] = true;
    if (mode_ == BlockSparseMode::kOn) {  // forced: no timing
      choice_.sparse[p] = true;
      choice_.config[p] = plan_->config_name(pass);
      choice_.dense_ms[p] = choice_.sparse_ms[p] = 0;
      TOPIARY_RETURN_IF_ERROR(sparse());
      return true;
    }
    // Where the filter gradient has only the plain kernel (no Hopper kernel takes the grid), it
    // loses to cuDNN on every layer measured (docs/PERFORMANCE.md), and one run of it on a
    // large layer takes longer than a training step: it runs only when forced.
    if (pass == SparsePass::kBackwardFilter && plan_->configs(pass) == 1) return false;
    // The sparse kernel's tile configurations are compared call by call, then the chosen one
    // and cuDNN's plan as captured graphs (cuDNN's host-side cost per call would otherwise
    // count against it, though a captured step never pays it).
    TOPIARY_RETURN_IF_ERROR(plan_->Tune(pass, in0, in1, out, ctx).status());
    // With the moments asked for, both sides with the batch norm's statistics: the route
    // measures itself on its first call (running the pass; its output is overwritten below),
    // and the block-sparse forward pays a pass over y where its configuration writes no
    // moments.
    float dense_ms = -1;
    if (moments_asked) {
      TOPIARY_RETURN_IF_ERROR(dense_route().status());
      dense_ms = request->route->route_ms();  // negative when the route is forced: untimed
    }
    const bool with_statistics = dense_ms >= 0;
    if (pass == SparsePass::kForward) choice_.forward_with_statistics = with_statistics;
    absl::StatusOr<float> sparse_ms;
    if (with_statistics) {
      mine.slices = moment_slices();
      std::function<absl::Status()> conv = sparse;
      if (mine.slices > 0) conv = with_moments;
      sparse_ms = request->route->TimeWithStatistics(conv, out, mine.slices > 0 ? &mine : nullptr,
                                                     request->workspace, ctx);
    } else {
      TOPIARY_ASSIGN_OR_RETURN(dense_ms, kernels::TimeCaptured(dense, ctx));
      sparse_ms = kernels::TimeCaptured(sparse, ctx, 10);
    }
    if (!sparse_ms.ok()) return sparse_ms.status();
    choice_.dense_ms[p] = dense_ms;
    choice_.sparse_ms[p] = *sparse_ms;
    choice_.config[p] = plan_->config_name(pass);
    choice_.sparse[p] = *sparse_ms < dense_ms;
    if (kernels::ConvLogEnabled()) {
      std::fprintf(stderr,
                   "%s %s: %.1f%% of blocks kept: block-sparse %.4f ms (%s), dense %.4f ms%s, "
                   "chose %s\n",
                   layer_.c_str(), kernels::SparsePassName(pass), 100.0 * choice_.density,
                   *sparse_ms, choice_.config[p].c_str(), dense_ms,
                   with_statistics ? " (both with the batch norm's statistics)" : "",
                   choice_.sparse[p] ? "block-sparse" : "dense");
    }
  }
  if (!choice_.sparse[p]) return dense_route();
  mine.slices = moment_slices();
  if (mine.slices > 0) {
    TOPIARY_RETURN_IF_ERROR(with_moments());
    *request->moments = mine;
    wrote_moments_ = true;
    return true;
  }
  TOPIARY_RETURN_IF_ERROR(sparse());
  return true;
}

}  // namespace topiary
