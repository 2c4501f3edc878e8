// The Linear layer (declared in layers.h); its kernels are kernels/conv/linear.h.
#include <cmath>

#include "kernels/conv/linear.h"
#include "trainer/nn/init.h"
#include "trainer/nn/layers.h"
#include "util/status_macros.h"

namespace topiary {

absl::StatusOr<Shape4> Linear::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() != 1) return absl::InvalidArgumentError(name() + ": takes one input");
  if (inputs[0].h != 1 || inputs[0].w != 1) {
    return absl::InvalidArgumentError(name() + ": linear input must be flattened");
  }
  in_ = inputs[0].c;
  TOPIARY_ASSIGN_OR_RETURN(auto k,
                           AddParameter(device, ParamRole::kKernel, {out_, in_}, true, true));
  kernel_ = k;
  TOPIARY_ASSIGN_OR_RETURN(auto b, AddParameter(device, ParamRole::kBias, {out_}, true, false));
  bias_ = b;
  return Shape4{1, 1, 1, out_};
}

void Linear::Initialize(Philox& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  FillUniform(kernel_, rng, bound);
  FillUniform(bias_, rng, bound);
}

void Linear::Describe(topiary::v1::LayerNode* node) const {
  Layer::Describe(node);
  node->set_out_channels(out_);
}

absl::StatusOr<LayerResources> Linear::Prepare(int batch, Device* device,
                                               const PlanOptions& options) {
  if (options.precision == kernels::Precision::kBf16) {
    TOPIARY_RETURN_IF_ERROR(AddBf16Copies(kernel_, device));
  }
  return LayerResources{};
}

absl::Status Linear::Forward(const LayerIo& io, bool training) {
  const kernels::LinearShape s{io.batch, in_, out_};
  if (io.cuda) {
    return kernels::LinearForwardCuda(io.dtype, s, io.x[0], WeightFor(*kernel_, io.dtype),
                                      bias_->value.data(), io.y, *io.cuda);
  }
  kernels::LinearForwardCpu(s, io.xf(0), kernel_->value.data(), bias_->value.data(), io.yf());
  return absl::OkStatus();
}

absl::Status Linear::Backward(const LayerIo& io) {
  const kernels::LinearShape s{io.batch, in_, out_};
  if (io.cuda) {
    TOPIARY_RETURN_IF_ERROR(kernels::LinearBackwardFilterCuda(io.dtype, s, io.x[0], io.dy,
                                                              WeightGradFor(*kernel_, io.dtype),
                                                              bias_->grad.data(), *io.cuda));
    if (io.dx[0] == nullptr) return absl::OkStatus();
    return kernels::LinearBackwardDataCuda(io.dtype, s, io.dy, WeightFor(*kernel_, io.dtype),
                                           io.dx[0], *io.cuda);
  }
  kernels::LinearBackwardFilterCpu(s, io.xf(0), io.dyf(), kernel_->grad.data(), bias_->grad.data());
  if (io.dx[0] != nullptr)
    kernels::LinearBackwardDataCpu(s, io.dyf(), kernel_->value.data(), io.dxf(0));
  return absl::OkStatus();
}

}  // namespace topiary
