#include "trainer/nn/moments_dispatch.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/runtime/cuda_timing.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// The batch norm that reads a convolution's output, as far as its statistics go.
kernels::BatchNormShape StatisticsShape(const kernels::ConvShape& s) {
  kernels::BatchNormShape bn;
  bn.m = static_cast<int64_t>(s.n) * s.ho() * s.wo();
  bn.c = s.k;
  return bn;
}

const char* Mode() {
  const char* env = std::getenv("TOPIARY_CONV_MOMENTS");
  return env != nullptr ? env : "";
}

}  // namespace

size_t MomentsDispatch::WorkspaceBytes(const kernels::ConvShape& shape) {
  return kernels::BatchNormWorkspaceFloatsCuda(StatisticsShape(shape)) * sizeof(float);
}

absl::StatusOr<std::unique_ptr<MomentsDispatch>> MomentsDispatch::Create(
    const std::string& layer, const kernels::ConvShape& shape, bool deterministic, Device* device) {
  const bool forced = std::strcmp(Mode(), "on") == 0;
  if (device->cuda() == nullptr || std::strcmp(Mode(), "off") == 0 || (deterministic && !forced)) {
    return nullptr;
  }
  const kernels::CudaContext& ctx = *device->cuda();
  auto plan = kernels::BlockSparseConvCuda::Create(
      shape, kernels::BlockGrid::Dense(shape.c, shape.k, shape.c, shape.k), kernels::DType::kBf16,
      ctx);
  if (!plan.ok()) return nullptr;  // a shape the block-sparse plans refuse: cuDNN's route
  // Room for the configuration with the most slices; until measured (or forced), the first
  // that writes moments runs.
  int slices = 0, first = -1;
  for (int config = 0; config < (*plan)->configs(kernels::SparsePass::kForward); ++config) {
    TOPIARY_RETURN_IF_ERROR((*plan)->set_config(kernels::SparsePass::kForward, config));
    const int n = (*plan)->forward_moment_slices(ctx);
    if (n > 0 && first < 0) first = config;
    slices = std::max(slices, n);
  }
  if (first < 0) return nullptr;  // no Hopper configuration takes the shape
  TOPIARY_RETURN_IF_ERROR((*plan)->set_config(kernels::SparsePass::kForward, first));
  std::unique_ptr<MomentsDispatch> d(new MomentsDispatch);
  d->layer_ = layer;
  d->shape_ = shape;
  d->forced_ = forced;
  d->plan_ = std::move(*plan);
  TOPIARY_ASSIGN_OR_RETURN(
      d->part_, Buffer<float>::Create(device, 3 * static_cast<size_t>(slices) * shape.k));
  // The timing's batch-norm parameters and outputs: thrown away, but zeros rather than NaN.
  const std::vector<float> zeros(8 * static_cast<size_t>(shape.k), 0.0f);
  TOPIARY_ASSIGN_OR_RETURN(d->scratch_, Buffer<float>::Create(device, zeros.size()));
  device->CopyFromHost(d->scratch_.data(), zeros.data(), zeros.size() * sizeof(float));
  return d;
}

absl::Status MomentsDispatch::Statistics(const void* y, const kernels::BatchNormMoments* moments,
                                         void* workspace, const kernels::CudaContext& ctx) const {
  const size_t k = shape_.k;
  float* f = scratch_.data();  // gamma, beta, running mean and variance, mean, inv std, [2] coef
  return kernels::BatchNormForwardTrainCuda(
      kernels::DType::kBf16, StatisticsShape(shape_), y, f, f + k, f + 2 * k, f + 3 * k, f + 4 * k,
      f + 5 * k, f + 6 * k, nullptr, static_cast<float*>(workspace), ctx, nullptr, moments);
}

absl::StatusOr<float> MomentsDispatch::TimeWithStatistics(const std::function<absl::Status()>& conv,
                                                          const void* y,
                                                          const kernels::BatchNormMoments* moments,
                                                          void* workspace,
                                                          const kernels::CudaContext& ctx) const {
  return kernels::TimeCaptured(
      [&]() -> absl::Status {
        TOPIARY_RETURN_IF_ERROR(conv());
        return Statistics(y, moments, workspace, ctx);
      },
      ctx);
}

absl::StatusOr<bool> MomentsDispatch::Run(const void* x, const void* w, void* y, void* workspace,
                                          kernels::BatchNormMoments* moments,
                                          const std::function<absl::Status()>& dense,
                                          const kernels::CudaContext& ctx) {
  using kernels::SparsePass;
  kernels::BatchNormMoments mine{part_.data(), 0};
  auto fused = [&]() -> absl::Status {
    TOPIARY_RETURN_IF_ERROR(plan_->Forward(x, w, nullptr, y, ctx, part_.data()));
    mine.slices = plan_->forward_moment_slices(ctx);
    return absl::OkStatus();
  };
  if (!measured_ && !forced_) {
    if (kernels::StreamCapturing(ctx)) return false;
    measured_ = true;
    TOPIARY_ASSIGN_OR_RETURN(unfused_ms_, TimeWithStatistics(dense, y, nullptr, workspace, ctx));
    int best = -1;
    for (int config = 0; config < plan_->configs(SparsePass::kForward); ++config) {
      TOPIARY_RETURN_IF_ERROR(plan_->set_config(SparsePass::kForward, config));
      if (plan_->forward_moment_slices(ctx) == 0) continue;
      TOPIARY_ASSIGN_OR_RETURN(const float ms, TimeWithStatistics(fused, y, &mine, workspace, ctx));
      if (best < 0 || ms < fused_ms_) best = config, fused_ms_ = ms;
    }
    TOPIARY_RETURN_IF_ERROR(plan_->set_config(SparsePass::kForward, best));
    chosen_ = fused_ms_ < unfused_ms_;
    if (kernels::ConvLogEnabled()) {
      std::fprintf(stderr,
                   "%s forward with the batch norm's moments: %s %.4f ms, cuDNN + statistics "
                   "%.4f ms, chose %s\n",
                   layer_.c_str(), plan_->config_name(SparsePass::kForward).c_str(), fused_ms_,
                   unfused_ms_, chosen_ ? "moments" : "cuDNN");
    }
  }
  if (!chosen_ && !forced_) return false;
  TOPIARY_RETURN_IF_ERROR(fused());
  *moments = mine;
  return true;
}

std::string MomentsDispatch::Describe() const {
  const std::string config = plan_->config_name(kernels::SparsePass::kForward);
  if (forced_) return absl::StrCat("forward with its batch norm's moments: ", config, " (forced)");
  if (!measured_) {
    return "once trained, forward times its batch norm's moments from a Hopper kernel against "
           "this";
  }
  return absl::StrFormat(
      "forward %s its batch norm's moments: %s %.4f ms with the statistics, against cuDNN + the "
      "statistics pass %.4f ms",
      chosen_ ? "with" : "without", config, fused_ms_, unfused_ms_);
}

}  // namespace topiary
