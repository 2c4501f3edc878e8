// Parameter-free layers: pooling, ReLU, residual add, flatten.
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/elementwise.h"
#include "kernels/pooling.h"
#include "trainer/layers.h"

namespace topiary {
namespace {

absl::StatusOr<Shape4> OneInput(const Layer& layer, const std::vector<Shape4>& inputs) {
  if (inputs.size() != 1) {
    return absl::InvalidArgumentError(layer.name() + ": takes exactly one input");
  }
  return inputs[0];
}

size_t Count(const Shape4& per_image, int batch) { return per_image.per_image() * batch; }

}  // namespace

kernels::PoolShape Pool2d::ShapeFor(int batch) const {
  kernels::PoolShape s;
  s.n = batch;
  s.h = in_.h;
  s.w = in_.w;
  s.c = in_.c;
  s.r = s.s = window_;
  s.stride_h = s.stride_w = stride_;
  s.pad_h = s.pad_w = pad_;
  return s;
}

absl::StatusOr<Shape4> Pool2d::Setup(const std::vector<Shape4>& inputs, Device* device) {
  auto in = OneInput(*this, inputs);
  if (!in.ok()) return in.status();
  in_ = *in;
  const kernels::PoolShape s = ShapeFor(1);
  if (auto st = kernels::CheckPoolShape(s); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s (input %dx%d)", name(), st.message(), in_.h, in_.w));
  }
  return Shape4{1, s.ho(), s.wo(), in_.c};
}

void Pool2d::Forward(const LayerIo& io, bool training) {
  if (kind_ == Kind::kMax) {
    kernels::MaxPoolForwardCpu(ShapeFor(io.batch), io.x[0], io.y);
  } else {
    kernels::AvgPoolForwardCpu(ShapeFor(io.batch), io.x[0], io.y);
  }
}

void Pool2d::Backward(const LayerIo& io) {
  if (kind_ == Kind::kMax) {
    kernels::MaxPoolBackwardCpu(ShapeFor(io.batch), io.x[0], io.y, io.dy, io.dx[0]);
  } else {
    kernels::AvgPoolBackwardCpu(ShapeFor(io.batch), io.dy, io.dx[0]);
  }
}

absl::StatusOr<Shape4> GlobalAvgPool::Setup(const std::vector<Shape4>& inputs, Device* device) {
  auto in = OneInput(*this, inputs);
  if (!in.ok()) return in.status();
  in_ = *in;
  return Shape4{1, 1, 1, in_.c};
}

void GlobalAvgPool::Forward(const LayerIo& io, bool training) {
  kernels::GlobalAvgPoolForwardCpu(io.batch, in_.h * in_.w, in_.c, io.x[0], io.y);
}

void GlobalAvgPool::Backward(const LayerIo& io) {
  kernels::GlobalAvgPoolBackwardCpu(io.batch, in_.h * in_.w, in_.c, io.dy, io.dx[0]);
}

absl::StatusOr<Shape4> Relu::Setup(const std::vector<Shape4>& inputs, Device* device) {
  auto in = OneInput(*this, inputs);
  if (!in.ok()) return in.status();
  in_ = *in;
  return in_;
}

void Relu::Forward(const LayerIo& io, bool training) {
  kernels::ReluForwardCpu(Count(in_, io.batch), io.x[0], io.y);
}

void Relu::Backward(const LayerIo& io) {
  kernels::ReluBackwardCpu(Count(in_, io.batch), io.y, io.dy, io.dx[0]);
}

absl::StatusOr<Shape4> Add::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() != 2 || !(inputs[0] == inputs[1])) {
    return absl::InvalidArgumentError(name() + ": add needs two inputs of the same shape");
  }
  in_ = inputs[0];
  return in_;
}

void Add::Forward(const LayerIo& io, bool training) {
  if (relu_) {
    kernels::AddReluCpu(Count(in_, io.batch), io.x[0], io.x[1], io.y);
  } else {
    kernels::AddCpu(Count(in_, io.batch), io.x[0], io.x[1], io.y);
  }
}

void Add::Backward(const LayerIo& io) {
  const size_t n = Count(in_, io.batch);
  if (relu_ && io.dx[0] != nullptr && io.dx[1] != nullptr) {
    kernels::AddReluBackwardCpu(n, io.y, io.dy, io.dx[0], io.dx[1]);
    return;
  }
  for (float* dx : io.dx) {
    if (dx == nullptr) continue;
    if (relu_) {
      kernels::ReluBackwardCpu(n, io.y, io.dy, dx);
    } else {
      std::memcpy(dx, io.dy, sizeof(float) * n);
    }
  }
}

absl::StatusOr<Shape4> Flatten::Setup(const std::vector<Shape4>& inputs, Device* device) {
  auto in = OneInput(*this, inputs);
  if (!in.ok()) return in.status();
  in_ = *in;
  return Shape4{1, 1, 1, static_cast<int>(in_.per_image())};
}

void Flatten::Forward(const LayerIo& io, bool training) {
  std::memcpy(io.y, io.x[0], sizeof(float) * Count(in_, io.batch));
}

void Flatten::Backward(const LayerIo& io) {
  std::memcpy(io.dx[0], io.dy, sizeof(float) * Count(in_, io.batch));
}

}  // namespace topiary
