#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/status_macros.h"
#include "trainer/nn/init.h"
#include "trainer/nn/layers.h"

namespace topiary {
namespace {

// On a GPU: the cuDNN plan (descriptors and measured algorithms) for this batch size.
struct ConvState : LayerState {
  std::unique_ptr<kernels::ConvCudaPlan> plan;
};

const kernels::ConvCudaPlan& Plan(const LayerIo& io) {
  return *static_cast<const ConvState*>(io.state)->plan;
}

}  // namespace

kernels::ConvShape Conv2d::ShapeFor(int batch) const {
  kernels::ConvShape s;
  s.n = batch;
  s.h = in_.h;
  s.w = in_.w;
  s.c = in_.c;
  s.k = config_.out_channels;
  s.r = config_.kernel_h;
  s.s = config_.kernel_w;
  s.stride_h = s.stride_w = config_.stride;
  s.pad_h = s.pad_w = config_.pad;
  return s;
}

absl::StatusOr<Shape4> Conv2d::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() != 1) return absl::InvalidArgumentError(name() + ": conv takes one input");
  in_ = inputs[0];
  const kernels::ConvShape s = ShapeFor(1);
  if (auto st = kernels::CheckConvShape(s); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s (input %dx%dx%d)", name(), st.message(), in_.h, in_.w, in_.c));
  }
  auto k = AddParameter(device, ParamRole::kKernel, {s.k, s.r, s.s, s.c}, true, true);
  if (!k.ok()) return k.status();
  kernel_ = *k;
  if (config_.bias) {
    auto b = AddParameter(device, ParamRole::kBias, {s.k}, true, false);
    if (!b.ok()) return b.status();
    bias_ = *b;
  }
  return Shape4{1, s.ho(), s.wo(), s.k};
}

void Conv2d::Initialize(Philox& rng) {
  const kernels::ConvShape s = ShapeFor(1);
  FillNormal(kernel_, rng, std::sqrt(2.0f / static_cast<float>(s.k * s.r * s.s)));
  if (bias_ != nullptr) FillUniform(bias_, rng, 1.0f / std::sqrt(static_cast<float>(s.patch())));
}

absl::StatusOr<LayerResources> Conv2d::Prepare(int batch, Device* device,
                                               const PlanOptions& options) {
  LayerResources r;
  if (device->cuda() == nullptr) {
    r.workspace_bytes = kernels::ConvWorkspaceFloatsCpu(ShapeFor(batch)) * sizeof(float);
    return r;
  }
  auto plan = kernels::ConvCudaPlan::Create(ShapeFor(batch), options.precision,
                                            options.conv_workspace_limit, options.deterministic,
                                            *device->cuda());
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), name() + ": " + std::string(plan.status().message()));
  }
  if (options.precision == kernels::Precision::kBf16) {
    TOPIARY_RETURN_IF_ERROR(AddBf16Copies(kernel_, device));
  }
  auto state = std::make_unique<ConvState>();
  r.workspace_bytes = (*plan)->workspace_bytes();
  state->plan = std::move(*plan);
  r.state = std::move(state);
  return r;
}

absl::Status Conv2d::Forward(const LayerIo& io, bool training) {
  const float* bias = bias_ ? bias_->value.data() : nullptr;
  if (io.cuda) {
    return Plan(io).Forward(io.x[0], WeightFor(*kernel_, io.dtype), bias, io.y, io.workspace,
                            *io.cuda);
  }
  kernels::Conv2dForwardCpu(ShapeFor(io.batch), io.xf(0), kernel_->value.data(), bias, io.yf(),
                            static_cast<float*>(io.workspace));
  return absl::OkStatus();
}

absl::Status Conv2d::Backward(const LayerIo& io) {
  float* dbias = bias_ ? bias_->grad.data() : nullptr;
  if (io.cuda) {
    TOPIARY_RETURN_IF_ERROR(Plan(io).BackwardFilter(
        io.x[0], io.dy, WeightGradFor(*kernel_, io.dtype), dbias, io.workspace, *io.cuda));
    if (io.dx[0] == nullptr) return absl::OkStatus();
    return Plan(io).BackwardData(io.dy, WeightFor(*kernel_, io.dtype), io.dx[0], io.workspace,
                                 *io.cuda);
  }
  const kernels::ConvShape s = ShapeFor(io.batch);
  float* ws = static_cast<float*>(io.workspace);
  kernels::Conv2dBackwardFilterCpu(s, io.xf(0), io.dyf(), kernel_->grad.data(), dbias, ws);
  if (io.dx[0] != nullptr) {
    kernels::Conv2dBackwardDataCpu(s, io.dyf(), kernel_->value.data(), io.dxf(0), ws);
  }
  return absl::OkStatus();
}

}  // namespace topiary
