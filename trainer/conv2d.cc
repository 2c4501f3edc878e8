#include <cmath>

#include "absl/strings/str_format.h"
#include "trainer/init.h"
#include "trainer/layers.h"

namespace topiary {

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
  auto k = AddParameter(device, "kernel", {s.k, s.r, s.s, s.c}, true, true);
  if (!k.ok()) return k.status();
  kernel_ = *k;
  if (config_.bias) {
    auto b = AddParameter(device, "bias", {s.k}, true, false);
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

size_t Conv2d::WorkspaceFloats(int batch) const {
  return kernels::ConvWorkspaceFloatsCpu(ShapeFor(batch));
}

void Conv2d::Forward(const LayerIo& io, bool training) {
  kernels::Conv2dForwardCpu(ShapeFor(io.batch), io.x[0], kernel_->value.data(),
                            bias_ ? bias_->value.data() : nullptr, io.y, io.workspace);
}

void Conv2d::Backward(const LayerIo& io) {
  const kernels::ConvShape s = ShapeFor(io.batch);
  kernels::Conv2dBackwardFilterCpu(s, io.x[0], io.dy, kernel_->grad.data(),
                                   bias_ ? bias_->grad.data() : nullptr, io.workspace);
  if (io.dx[0] != nullptr) {
    kernels::Conv2dBackwardDataCpu(s, io.dy, kernel_->value.data(), io.dx[0], io.workspace);
  }
}

}  // namespace topiary
