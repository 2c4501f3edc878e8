#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/approx/approx_conv.h"
#include "kernels/conv/sampled_grad.h"
#include "trainer/nn/init.h"
#include "trainer/nn/layers.h"
#include "util/status_macros.h"

namespace topiary {

kernels::ConvShape ConvShapeOf(const Conv2d::Config& config, const Shape4& in, int batch) {
  kernels::ConvShape s;
  s.n = batch;
  s.h = in.h;
  s.w = in.w;
  s.c = in.c;
  s.k = config.out_channels;
  s.r = config.kernel_h;
  s.s = config.kernel_w;
  s.stride_h = s.stride_w = config.stride;
  s.pad_h = s.pad_w = config.pad;
  return s;
}

void DescribeConvConfig(const Conv2d::Config& config, topiary::v1::LayerNode* node) {
  node->set_out_channels(config.out_channels);
  node->set_kernel_h(config.kernel_h);
  node->set_kernel_w(config.kernel_w);
  node->set_stride(config.stride);
  node->set_pad(config.pad);
  node->set_bias(config.bias);
}

kernels::ConvShape Conv2d::ShapeFor(int batch) const { return ConvShapeOf(config_, in_, batch); }

absl::StatusOr<Shape4> Conv2d::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() != 1) return absl::InvalidArgumentError(name() + ": conv takes one input");
  in_ = inputs[0];
  const kernels::ConvShape s = ShapeFor(1);
  if (auto st = kernels::CheckConvShape(s); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s (input %dx%dx%d)", name(), st.message(), in_.h, in_.w, in_.c));
  }
  TOPIARY_ASSIGN_OR_RETURN(
      auto k, AddParameter(device, ParamRole::kKernel, {s.k, s.r, s.s, s.c}, true, true));
  kernel_ = k;
  if (config_.bias) {
    TOPIARY_ASSIGN_OR_RETURN(auto b, AddParameter(device, ParamRole::kBias, {s.k}, true, false));
    bias_ = b;
  }
  return Shape4{1, s.ho(), s.wo(), s.k};
}

void Conv2d::Initialize(Philox& rng) {
  const kernels::ConvShape s = ShapeFor(1);
  FillNormal(kernel_, rng, std::sqrt(2.0f / static_cast<float>(s.k * s.r * s.s)));
  if (bias_ != nullptr) FillUniform(bias_, rng, 1.0f / std::sqrt(static_cast<float>(s.patch())));
}

void Conv2d::Describe(topiary::v1::LayerNode* node) const {
  Layer::Describe(node);
  DescribeConvConfig(config_, node);
}

absl::Status Conv2d::Approximate(ConvApproximation approx, Device* device) {
  if (kernel_ == nullptr) return absl::FailedPreconditionError(name() + ": not set up");
  if (approximation_) return absl::FailedPreconditionError(name() + ": already approximate");
  if (auto st = kernels::CheckApproxConvShape(ShapeFor(1)); !st.ok()) {
    return absl::InvalidArgumentError(name() + ": " + std::string(st.message()));
  }
  Parameter* range = nullptr;
  if (approx.range == ConvApproximation::Range::kMovingAverage) {
    TOPIARY_ASSIGN_OR_RETURN(auto r, AddParameter(device, ParamRole::kActivationRange, {3},
                                                  /*trainable=*/false, /*decay=*/false));
    range = r;
    const float unobserved[3] = {0.0f, 0.0f, 0.0f};
    range->value.CopyFromHost(unobserved);
  }
  TOPIARY_ASSIGN_OR_RETURN(auto engine, MakeApproxConvEngine(approx, range, device));
  engine_ = std::move(engine);
  approximation_ = std::move(approx);
  return absl::OkStatus();
}

absl::Status Conv2d::SampleWeightGradients(GradientSampling sampling) {
  if (kernel_ == nullptr) return absl::FailedPreconditionError(name() + ": not set up");
  if (auto st = kernels::CheckSampledWeightGradShape(ShapeFor(1), sampling.top_k); !st.ok()) {
    return absl::InvalidArgumentError(name() + ": " + std::string(st.message()));
  }
  sampling_ = sampling;
  return absl::OkStatus();
}

absl::StatusOr<LayerResources> Conv2d::Prepare(int batch, Device* device,
                                               const PlanOptions& options) {
  return engine_->Prepare(Operands(batch), device, options);
}

absl::Status Conv2d::Forward(const LayerIo& io, bool training) {
  return engine_->Forward(Operands(io.batch), io, training);
}

absl::Status Conv2d::Backward(const LayerIo& io) {
  return engine_->Backward(Operands(io.batch), io);
}

}  // namespace topiary
