// Parameter-free layers: pooling, activations, residual add, product, flatten.
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/norm_pool/pooling.h"
#include "trainer/nn/layers.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

absl::StatusOr<Shape4> OneInput(const Layer& layer, const std::vector<Shape4>& inputs) {
  if (inputs.size() != 1) {
    return absl::InvalidArgumentError(layer.name() + ": takes exactly one input");
  }
  return inputs[0];
}

int64_t Count(const Shape4& per_image, int batch) {
  return static_cast<int64_t>(per_image.per_image()) * batch;
}

// Copies n activation elements.
absl::Status Copy(const LayerIo& io, int64_t n, const void* src, void* dst) {
  const int64_t bytes = n * static_cast<int64_t>(kernels::SizeOf(io.dtype));
  if (io.cuda) return kernels::CopyCuda(bytes, src, dst, *io.cuda);
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

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
  TOPIARY_ASSIGN_OR_RETURN(auto in, OneInput(*this, inputs));
  in_ = in;
  const kernels::PoolShape s = ShapeFor(1);
  if (auto st = kernels::CheckPoolShape(s); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s (input %dx%d)", name(), st.message(), in_.h, in_.w));
  }
  return Shape4{1, s.ho(), s.wo(), in_.c};
}

void Pool2d::Describe(topiary::v1::LayerNode* node) const {
  Layer::Describe(node);
  node->set_window(window_);
  node->set_stride(stride_);
  node->set_pad(pad_);
}

absl::StatusOr<LayerResources> Pool2d::Prepare(int batch, Device* device,
                                               const PlanOptions& options) {
  LayerResources r;
  if (kind_ == Kind::kMax && device->cuda() != nullptr) {
    const kernels::PoolShape s = ShapeFor(batch);
    const size_t outputs = static_cast<size_t>(s.n) * s.ho() * s.wo() * s.c;
    r.scratch_floats = (outputs + sizeof(float) - 1) / sizeof(float);  // one byte per output
  }
  return r;
}

absl::Status Pool2d::Forward(const LayerIo& io, bool training) {
  const kernels::PoolShape s = ShapeFor(io.batch);
  const bool max = kind_ == Kind::kMax;
  if (io.cuda) {
    // The argmax bytes live in the scratch kept from forward to backward.
    return max ? kernels::MaxPoolForwardCuda(io.dtype, s, io.x[0], io.y,
                                             reinterpret_cast<uint8_t*>(io.scratch), *io.cuda)
               : kernels::AvgPoolForwardCuda(io.dtype, s, io.x[0], io.y, *io.cuda);
  }
  if (max) {
    kernels::MaxPoolForwardCpu(s, io.xf(0), io.yf());
  } else {
    kernels::AvgPoolForwardCpu(s, io.xf(0), io.yf());
  }
  return absl::OkStatus();
}

absl::Status Pool2d::Backward(const LayerIo& io) {
  const kernels::PoolShape s = ShapeFor(io.batch);
  const bool max = kind_ == Kind::kMax;
  if (io.cuda) {
    return max ? kernels::MaxPoolBackwardCuda(io.dtype, s,
                                              reinterpret_cast<const uint8_t*>(io.scratch), io.dy,
                                              io.dx[0], *io.cuda)
               : kernels::AvgPoolBackwardCuda(io.dtype, s, io.dy, io.dx[0], *io.cuda);
  }
  if (max) {
    kernels::MaxPoolBackwardCpu(s, io.xf(0), io.yf(), io.dyf(), io.dxf(0));
  } else {
    kernels::AvgPoolBackwardCpu(s, io.dyf(), io.dxf(0));
  }
  return absl::OkStatus();
}

absl::StatusOr<Shape4> GlobalAvgPool::Setup(const std::vector<Shape4>& inputs, Device* device) {
  TOPIARY_ASSIGN_OR_RETURN(auto in, OneInput(*this, inputs));
  in_ = in;
  return Shape4{1, 1, 1, in_.c};
}

absl::Status GlobalAvgPool::Forward(const LayerIo& io, bool training) {
  if (io.cuda) {
    return kernels::GlobalAvgPoolForwardCuda(io.dtype, io.batch, in_.h * in_.w, in_.c, io.x[0],
                                             io.y, *io.cuda);
  }
  kernels::GlobalAvgPoolForwardCpu(io.batch, in_.h * in_.w, in_.c, io.xf(0), io.yf());
  return absl::OkStatus();
}

absl::Status GlobalAvgPool::Backward(const LayerIo& io) {
  if (io.cuda) {
    return kernels::GlobalAvgPoolBackwardCuda(io.dtype, io.batch, in_.h * in_.w, in_.c, io.dy,
                                              io.dx[0], *io.cuda);
  }
  kernels::GlobalAvgPoolBackwardCpu(io.batch, in_.h * in_.w, in_.c, io.dyf(), io.dxf(0));
  return absl::OkStatus();
}

absl::StatusOr<Shape4> Relu::Setup(const std::vector<Shape4>& inputs, Device* device) {
  TOPIARY_ASSIGN_OR_RETURN(auto in, OneInput(*this, inputs));
  in_ = in;
  return in_;
}

absl::Status Relu::Forward(const LayerIo& io, bool training) {
  const int64_t n = Count(in_, io.batch);
  if (io.cuda) {
    return (six_ ? kernels::Relu6ForwardCuda : kernels::ReluForwardCuda)(io.dtype, n, io.x[0], io.y,
                                                                         *io.cuda);
  }
  (six_ ? kernels::Relu6ForwardCpu : kernels::ReluForwardCpu)(n, io.xf(0), io.yf());
  return absl::OkStatus();
}

absl::Status Relu::Backward(const LayerIo& io) {
  const int64_t n = Count(in_, io.batch);
  if (io.cuda) {
    return (six_ ? kernels::Relu6BackwardCuda : kernels::ReluBackwardCuda)(io.dtype, n, io.y, io.dy,
                                                                           io.dx[0], *io.cuda);
  }
  (six_ ? kernels::Relu6BackwardCpu : kernels::ReluBackwardCpu)(n, io.yf(), io.dyf(), io.dxf(0));
  return absl::OkStatus();
}

namespace {
kernels::ActivationKind KindOf(LayerKind kind) {
  switch (kind) {
    case LayerKind::kSilu:
      return kernels::ActivationKind::kSilu;
    case LayerKind::kLeakyRelu:
      return kernels::ActivationKind::kLeakyRelu;
    case LayerKind::kHardSigmoid:
      return kernels::ActivationKind::kHardSigmoid;
    case LayerKind::kHardSwish:
      return kernels::ActivationKind::kHardSwish;
    default:
      return kernels::ActivationKind::kSigmoid;
  }
}
}  // namespace

Activation::Activation(std::string name, LayerKind kind, float alpha, float beta)
    : Layer(std::move(name)), kind_(kind) {
  params_.kind = KindOf(kind);
  params_.alpha = alpha;
  params_.beta = beta;
}

absl::StatusOr<Shape4> Activation::Setup(const std::vector<Shape4>& inputs, Device* device) {
  TOPIARY_ASSIGN_OR_RETURN(auto in, OneInput(*this, inputs));
  in_ = in;
  return in_;
}

void Activation::Describe(topiary::v1::LayerNode* node) const {
  Layer::Describe(node);
  node->set_alpha(params_.alpha);
  node->set_beta(params_.beta);
}

absl::Status Activation::Forward(const LayerIo& io, bool training) {
  const int64_t n = Count(in_, io.batch);
  if (io.cuda) return kernels::ActivationForwardCuda(io.dtype, params_, n, io.x[0], io.y, *io.cuda);
  kernels::ActivationForwardCpu(params_, n, io.xf(0), io.yf());
  return absl::OkStatus();
}

absl::Status Activation::Backward(const LayerIo& io) {
  const int64_t n = Count(in_, io.batch);
  if (io.cuda) {
    return kernels::ActivationBackwardCuda(io.dtype, params_, n, io.x[0], io.dy, io.dx[0],
                                           *io.cuda);
  }
  kernels::ActivationBackwardCpu(params_, n, io.xf(0), io.dyf(), io.dxf(0));
  return absl::OkStatus();
}

absl::StatusOr<Shape4> Mul::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() == 2 && inputs[0] == inputs[1]) {
    in_ = inputs[0];
    pixels_ = 0;
    map_ = 0;
    return in_;
  }
  for (int m = 0; m < 2 && inputs.size() == 2; ++m) {
    const Shape4& scale = inputs[1 - m];
    if (scale.h == 1 && scale.w == 1 && scale.c == inputs[m].c) {
      in_ = inputs[m];
      pixels_ = in_.h * in_.w;
      map_ = m;
      return in_;
    }
  }
  return absl::InvalidArgumentError(
      name() + ": mul needs two inputs of one shape, or a map and one value per channel of it");
}

absl::Status Mul::Forward(const LayerIo& io, bool training) {
  const int64_t rows = int64_t{io.batch} * in_.h * in_.w;
  if (io.cuda) {
    return kernels::MulForwardCuda(io.dtype, rows, in_.c, pixels_, io.x[map_], io.x[1 - map_], io.y,
                                   *io.cuda);
  }
  kernels::MulForwardCpu(rows, in_.c, pixels_, io.xf(map_), io.xf(1 - map_), io.yf());
  return absl::OkStatus();
}

absl::Status Mul::Backward(const LayerIo& io) {
  const int64_t rows = int64_t{io.batch} * in_.h * in_.w;
  if (io.cuda) {
    return kernels::MulBackwardCuda(io.dtype, rows, in_.c, pixels_, io.x[map_], io.x[1 - map_],
                                    io.dy, io.dx[map_], io.dx[1 - map_], *io.cuda);
  }
  kernels::MulBackwardCpu(rows, in_.c, pixels_, io.xf(map_), io.xf(1 - map_), io.dyf(),
                          io.dxf(map_), io.dxf(1 - map_));
  return absl::OkStatus();
}

absl::StatusOr<Shape4> Add::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() != 2 || !(inputs[0] == inputs[1])) {
    return absl::InvalidArgumentError(name() + ": add needs two inputs of the same shape");
  }
  in_ = inputs[0];
  return in_;
}

void Add::Describe(topiary::v1::LayerNode* node) const {
  Layer::Describe(node);
  node->set_relu(relu_);
}

absl::Status Add::Forward(const LayerIo& io, bool training) {
  const int64_t n = Count(in_, io.batch);
  if (io.cuda) {
    return relu_ ? kernels::AddReluCuda(io.dtype, n, io.x[0], io.x[1], io.y, *io.cuda)
                 : kernels::AddCuda(io.dtype, n, io.x[0], io.x[1], io.y, *io.cuda);
  }
  if (relu_) {
    kernels::AddReluCpu(n, io.xf(0), io.xf(1), io.yf());
  } else {
    kernels::AddCpu(n, io.xf(0), io.xf(1), io.yf());
  }
  return absl::OkStatus();
}

absl::Status Add::Backward(const LayerIo& io) {
  const int64_t n = Count(in_, io.batch);
  if (relu_ && io.dx[0] != nullptr && io.dx[1] != nullptr) {
    if (io.dy2 != nullptr) {  // the other reader's gradient, summed as it is read
      if (io.cuda) {
        return kernels::AddReluBackwardSumCuda(io.dtype, n, io.y, io.dy, io.dy2, io.dx[0], io.dx[1],
                                               *io.cuda);
      }
      kernels::AddReluBackwardSumCpu(n, io.yf(), io.dyf(), static_cast<const float*>(io.dy2),
                                     io.dxf(0), io.dxf(1));
      return absl::OkStatus();
    }
    if (io.cuda) {
      return kernels::AddReluBackwardCuda(io.dtype, n, io.y, io.dy, io.dx[0], io.dx[1], *io.cuda);
    }
    kernels::AddReluBackwardCpu(n, io.yf(), io.dyf(), io.dxf(0), io.dxf(1));
    return absl::OkStatus();
  }
  if (io.dy2 != nullptr) return absl::InternalError(name() + ": dy2 without both input gradients");
  for (void* dx : io.dx) {
    if (dx == nullptr) continue;
    if (!relu_) {
      TOPIARY_RETURN_IF_ERROR(Copy(io, n, io.dy, dx));
    } else if (io.cuda) {
      TOPIARY_RETURN_IF_ERROR(kernels::ReluBackwardCuda(io.dtype, n, io.y, io.dy, dx, *io.cuda));
    } else {
      kernels::ReluBackwardCpu(n, io.yf(), io.dyf(), static_cast<float*>(dx));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Shape4> Flatten::Setup(const std::vector<Shape4>& inputs, Device* device) {
  TOPIARY_ASSIGN_OR_RETURN(auto in, OneInput(*this, inputs));
  in_ = in;
  return Shape4{1, 1, 1, static_cast<int>(in_.per_image())};
}

absl::Status Flatten::Forward(const LayerIo& io, bool training) {
  return Copy(io, Count(in_, io.batch), io.x[0], io.y);
}

absl::Status Flatten::Backward(const LayerIo& io) {
  return Copy(io, Count(in_, io.batch), io.dy, io.dx[0]);
}

absl::StatusOr<Shape4> Concat::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() < 2) return absl::InvalidArgumentError(name() + ": concat needs two inputs");
  out_ = inputs[0];
  out_.c = 0;
  for (const Shape4& in : inputs) {
    if (in.h != out_.h || in.w != out_.w) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: concat inputs differ in size (%dx%d and %dx%d)", name(), out_.h,
                          out_.w, in.h, in.w));
    }
    channels_.push_back(in.c);
    out_.c += in.c;
  }
  return out_;
}

absl::Status Concat::Forward(const LayerIo& io, bool training) {
  const int64_t rows = static_cast<int64_t>(io.batch) * out_.h * out_.w;
  int offset = 0;
  for (size_t i = 0; i < channels_.size(); ++i) {
    if (io.cuda) {
      TOPIARY_RETURN_IF_ERROR(kernels::ConcatChannelsCuda(io.dtype, rows, channels_[i], out_.c,
                                                          offset, io.x[i], io.y, *io.cuda));
    } else {
      kernels::ConcatChannelsCpu(rows, channels_[i], out_.c, offset, io.xf(i), io.yf());
    }
    offset += channels_[i];
  }
  return absl::OkStatus();
}

absl::Status Concat::Backward(const LayerIo& io) {
  const int64_t rows = static_cast<int64_t>(io.batch) * out_.h * out_.w;
  int offset = 0;
  for (size_t i = 0; i < channels_.size(); offset += channels_[i], ++i) {
    if (io.dx[i] == nullptr) continue;
    if (io.cuda) {
      TOPIARY_RETURN_IF_ERROR(kernels::SplitChannelsCuda(io.dtype, rows, channels_[i], out_.c,
                                                         offset, io.dy, io.dx[i], *io.cuda));
    } else {
      kernels::SplitChannelsCpu(rows, channels_[i], out_.c, offset, io.dyf(), io.dxf(i));
    }
  }
  return absl::OkStatus();
}

}  // namespace topiary
