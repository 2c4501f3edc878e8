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
  if (kernel.mask_info.kind != MaskInfo::Kind::kBlock && plan_ == nullptr) return false;
  const bool capturing = kernels::StreamCapturing(ctx);
  if (kernel.mask_version != version_) {
    if (capturing) return false;  // not planned for this mask: dense is correct for any mask
    TOPIARY_RETURN_IF_ERROR(Replan(kernel, ctx));
  }
  if (plan_ == nullptr) return false;
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
  const int p = static_cast<int>(pass);
  if (!measured_[p]) {
    if (capturing) return false;
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
    TOPIARY_ASSIGN_OR_RETURN(auto dense_ms, kernels::TimeCaptured(dense, ctx));
    auto sparse_ms = kernels::TimeCaptured(sparse, ctx, 10);
    if (!sparse_ms.ok()) return sparse_ms.status();
    choice_.dense_ms[p] = dense_ms;
    choice_.sparse_ms[p] = *sparse_ms;
    choice_.config[p] = plan_->config_name(pass);
    choice_.sparse[p] = *sparse_ms < dense_ms;
    if (kernels::ConvLogEnabled()) {
      std::fprintf(stderr,
                   "%s %s: %.1f%% of blocks kept: block-sparse %.4f ms (%s), dense %.4f ms, chose "
                   "%s\n",
                   layer_.c_str(), kernels::SparsePassName(pass), 100.0 * choice_.density,
                   *sparse_ms, choice_.config[p].c_str(), dense_ms,
                   choice_.sparse[p] ? "block-sparse" : "dense");
    }
  }
  if (!choice_.sparse[p]) return false;
  if (pass == SparsePass::kForward && request != nullptr && bias == nullptr) {
    const int slices = plan_->forward_moment_slices(ctx);
    if (slices > 0 && slices <= request->capacity) {
      TOPIARY_RETURN_IF_ERROR(plan_->Forward(in0, in1, nullptr, out, ctx, request->part));
      *request->moments = {request->part, slices};
      wrote_moments_ = true;
      return true;
    }
  }
  TOPIARY_RETURN_IF_ERROR(sparse());
  return true;
}

}  // namespace topiary
