// The GroupedConv2d layer (declared in layers.h); its kernels are kernels/conv/grouped_conv.h.
#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/elementwise/elementwise.h"
#include "trainer/nn/init.h"
#include "trainer/nn/layers.h"
#include "util/status_macros.h"

namespace topiary {

kernels::GroupedConvShape GroupedConv2d::ShapeFor(int batch) const {
  return {ConvShapeOf(config_, in_, batch), groups_};
}

absl::StatusOr<Shape4> GroupedConv2d::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() != 1) return absl::InvalidArgumentError(name() + ": conv takes one input");
  in_ = inputs[0];
  const kernels::GroupedConvShape g = ShapeFor(1);
  if (auto st = kernels::CheckGroupedConvShape(g); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s (input %dx%dx%d)", name(), st.message(), in_.h, in_.w, in_.c));
  }
  const kernels::ConvShape& s = g.conv;
  TOPIARY_ASSIGN_OR_RETURN(
      auto k, AddParameter(device, ParamRole::kKernel, {s.k, s.r, s.s, g.cg()}, true, true));
  kernel_ = k;
  if (config_.bias) {
    TOPIARY_ASSIGN_OR_RETURN(auto b, AddParameter(device, ParamRole::kBias, {s.k}, true, false));
    bias_ = b;
  }
  return Shape4{1, s.ho(), s.wo(), s.k};
}

void GroupedConv2d::Initialize(Philox& rng) {
  const kernels::GroupedConvShape g = ShapeFor(1);
  const kernels::ConvShape& s = g.conv;
  // Kaiming normal, fan-out: each output channel's filter sees R*S*(K/groups) of fan-out.
  FillNormal(kernel_, rng, std::sqrt(2.0f / static_cast<float>(g.kg() * s.r * s.s)));
  if (bias_ != nullptr)
    FillUniform(bias_, rng, 1.0f / std::sqrt(static_cast<float>(s.r * s.s * g.cg())));
}

void GroupedConv2d::Describe(topiary::v1::LayerNode* node) const {
  Layer::Describe(node);
  DescribeConvConfig(config_, node);
  node->set_groups(groups_);
}

absl::Status GroupedConv2d::Forward(const LayerIo& io, bool training) {
  const kernels::GroupedConvShape g = ShapeFor(io.batch);
  const float* bias = bias_ ? bias_->value.data() : nullptr;
  if (io.cuda) {
    return kernels::GroupedConvForwardCuda(io.dtype, g, io.x[0], kernel_->value.data(), bias, io.y,
                                           *io.cuda);
  }
  kernels::GroupedConvForwardCpu(g, io.xf(0), kernel_->value.data(), bias, io.yf());
  return absl::OkStatus();
}

absl::Status GroupedConv2d::Backward(const LayerIo& io) {
  const kernels::GroupedConvShape g = ShapeFor(io.batch);
  const int64_t rows = static_cast<int64_t>(io.batch) * g.conv.ho() * g.conv.wo();
  if (io.cuda) {
    TOPIARY_RETURN_IF_ERROR(kernels::GroupedConvBackwardFilterCuda(io.dtype, g, io.x[0], io.dy,
                                                                   kernel_->grad.data(), *io.cuda));
    if (bias_) {
      TOPIARY_RETURN_IF_ERROR(
          kernels::BiasGradCuda(io.dtype, rows, g.conv.k, io.dy, bias_->grad.data(), *io.cuda));
    }
    if (io.dx[0] == nullptr) return absl::OkStatus();
    return kernels::GroupedConvBackwardDataCuda(io.dtype, g, io.dy, kernel_->value.data(), io.dx[0],
                                                *io.cuda);
  }
  kernels::GroupedConvBackwardFilterCpu(g, io.xf(0), io.dyf(), kernel_->grad.data(),
                                        bias_ ? bias_->grad.data() : nullptr);
  if (io.dx[0] != nullptr) {
    kernels::GroupedConvBackwardDataCpu(g, io.dyf(), kernel_->value.data(), io.dxf(0));
  }
  return absl::OkStatus();
}

}  // namespace topiary
