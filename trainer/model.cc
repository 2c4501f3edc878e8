#include "trainer/model.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "kernels/status_macros.h"

namespace topiary {

Model::Model(std::string arch, Device* device, Shape4 input, int classes)
    : arch_(std::move(arch)), device_(device), classes_(classes) {
  input.n = 1;
  shapes_.push_back(input);
}

int Model::Add(std::unique_ptr<Layer> layer, std::vector<int> inputs) {
  if (!status_.ok()) return -1;
  if (FindLayer(layer->name()) != nullptr) {
    status_ = absl::InvalidArgumentError("duplicate layer name " + layer->name());
    return -1;
  }
  std::vector<Shape4> in;
  for (int v : inputs) {
    if (v < 0 || v >= static_cast<int>(shapes_.size())) {
      status_ = absl::InvalidArgumentError(layer->name() + ": reads an unknown value");
      return -1;
    }
    in.push_back(shapes_[v]);
  }
  auto out = layer->Setup(in, device_);
  if (!out.ok()) {
    status_ = out.status();
    return -1;
  }
  shapes_.push_back(*out);
  nodes_.push_back({layer.get(), std::move(inputs), static_cast<int>(shapes_.size()) - 1});
  layers_.push_back(std::move(layer));
  return nodes_.back().output;
}

absl::Status Model::Finish(int output) {
  if (!status_.ok()) return status_;
  const Shape4& s = shapes_[output];
  if (s.h != 1 || s.w != 1 || s.c != classes_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model output is %dx%dx%d, expected %d class logits", s.h, s.w, s.c, classes_));
  }
  output_ = output;
  return absl::OkStatus();
}

void Model::Initialize(uint64_t seed) {
  Philox rng(seed, RngStream::kInit);
  for (auto& layer : layers_) layer->Initialize(rng);
}

std::vector<Parameter*> Model::parameters() const {
  std::vector<Parameter*> out;
  for (const auto& layer : layers_) {
    for (Parameter* p : layer->parameters()) out.push_back(p);
  }
  return out;
}

int64_t Model::trainable_parameter_count() const {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += p->trainable ? static_cast<int64_t>(p->size()) : 0;
  return n;
}

Layer* Model::FindLayer(const std::string& name) const {
  for (const auto& layer : layers_) {
    if (layer->name() == name) return layer.get();
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Network>> Network::Plan(Model* model, int batch, bool training,
                                                       const PlanOptions& options) {
  if (model->output() < 0) return absl::FailedPreconditionError("model not finished");
  std::unique_ptr<Network> net(new Network(model, batch, training));
  if (auto st = net->Allocate(options); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrFormat("planning %s for batch %d on %s: %s", model->arch(), batch,
                                        model->device()->name(), st.message()));
  }
  return net;
}

absl::Status Network::Allocate(const PlanOptions& options) {
  Device* dev = model_->device();
  const auto& shapes = model_->value_shapes();
  const auto& nodes = model_->nodes();
  const int num_nodes = static_cast<int>(nodes.size());
  auto floats = [&](size_t count) -> absl::StatusOr<Buffer<float>> {
    planned_bytes_ += count * sizeof(float);
    return Buffer<float>::Create(dev, count);
  };

  values_.resize(shapes.size());
  for (size_t v = 0; v < shapes.size(); ++v) {
    planned_bytes_ += shapes[v].per_image() * batch_ * sizeof(float);
    auto data = Tensor::Create(dev, {batch_, shapes[v].h, shapes[v].w, shapes[v].c});
    if (!data.ok()) return data.status();
    values_[v].data = std::move(*data);
  }

  // Gradients live in the backward pass from the step that writes them (the consumer's
  // backward; the loss, for the logits) through the step that reads them (the producer's
  // backward). Step t runs node N-1-t; the loss is step -1. A buffer is reused by a later
  // gradient of the same size once its last reader has run (strictly before: a layer reads
  // dy and writes dx in the same step, so those must differ).
  std::vector<int> producer(shapes.size(), -1);
  for (int j = 0; j < num_nodes; ++j) producer[nodes[j].output] = j;
  struct Slot {
    size_t floats;
    int busy_until;
    float* data;
  };
  std::vector<Slot> slots;
  auto grad_buffer = [&](int v, int write_step) -> absl::StatusOr<float*> {
    const size_t count = shapes[v].per_image() * batch_;
    const int read_step = num_nodes - 1 - producer[v];
    for (Slot& s : slots) {
      if (s.floats == count && s.busy_until < write_step) {
        s.busy_until = read_step;
        return s.data;
      }
    }
    planned_bytes_ += count * sizeof(float);
    auto t = Tensor::Create(dev, {batch_, shapes[v].h, shapes[v].w, shapes[v].c});
    if (!t.ok()) return t.status();
    grad_pool_.push_back(std::move(*t));
    slots.push_back({count, read_step, grad_pool_.back().data()});
    return slots.back().data;
  };

  io_.resize(nodes.size());
  if (training_) {
    auto g = grad_buffer(model_->output(), -1);
    if (!g.ok()) return g.status();
    values_[model_->output()].grad = *g;
  }
  // Wire the inputs; gradients in backward order (last node first) so buffers recycle.
  std::vector<int> consumers(shapes.size(), 0);
  for (int j = 0; j < num_nodes; ++j) {
    for (int v : nodes[j].inputs) ++consumers[v];
  }
  for (int j = 0; j < num_nodes; ++j) {
    LayerIo& io = io_[j];
    io.x.clear();
    for (int v : nodes[j].inputs) io.x.push_back(values_[v].data.data());
    io.dx.assign(nodes[j].inputs.size(), nullptr);
  }
  for (int j = num_nodes - 1; j >= 0 && training_; --j) {
    const int step = num_nodes - 1 - j;
    for (size_t k = 0; k < nodes[j].inputs.size(); ++k) {
      const int v = nodes[j].inputs[k];
      if (v == 0) continue;  // the network input needs no gradient
      auto g = grad_buffer(v, step);
      if (!g.ok()) return g.status();
      // The first consumer in forward order (the last to run backward) owns the summed
      // gradient; the others write extra buffers that are added into it.
      Value& val = values_[v];
      if (--consumers[v] == 0) {
        val.grad = *g;
      } else {
        val.extra_grads.push_back(*g);
      }
      io_[j].dx[k] = *g;
    }
  }

  size_t workspace_bytes = 0;
  scratch_.resize(nodes.size());
  states_.resize(nodes.size());
  for (int j = 0; j < num_nodes; ++j) {
    LayerIo& io = io_[j];
    io.batch = batch_;
    io.cuda = dev->cuda();
    io.y = values_[nodes[j].output].data.data();
    io.dy = training_ ? values_[nodes[j].output].grad : nullptr;
    auto res = nodes[j].layer->Prepare(batch_, dev, options);
    if (!res.ok()) return res.status();
    auto scratch = floats(res->scratch_floats);
    if (!scratch.ok()) return scratch.status();
    scratch_[j] = std::move(*scratch);
    io.scratch = scratch_[j].data();
    states_[j] = std::move(res->state);
    io.state = states_[j].get();
    workspace_bytes = std::max(workspace_bytes, res->workspace_bytes);
  }
  auto ws = floats((workspace_bytes + sizeof(float) - 1) / sizeof(float));
  if (!ws.ok()) return ws.status();
  workspace_ = std::move(*ws);
  for (auto& io : io_) io.workspace = workspace_.data();

  auto labels = Buffer<int32_t>::Create(dev, batch_);
  if (!labels.ok()) return labels.status();
  labels_ = std::move(*labels);
  if (dev->cuda() != nullptr) {
    auto loss = Buffer<float>::Create(dev, batch_);
    auto rank = Buffer<int32_t>::Create(dev, batch_);
    auto metrics = Buffer<double>::Create(dev, 4);
    if (!loss.ok()) return loss.status();
    if (!rank.ok()) return rank.status();
    if (!metrics.ok()) return metrics.status();
    sample_loss_ = std::move(*loss);
    rank_ = std::move(*rank);
    metrics_ = std::move(*metrics);
  }
  return absl::OkStatus();
}

absl::Status Network::Forward(bool training) {
  const auto& nodes = model_->nodes();
  for (size_t j = 0; j < nodes.size(); ++j) {
    TOPIARY_RETURN_IF_ERROR(nodes[j].layer->Forward(io_[j], training));
    if (hook_) TOPIARY_RETURN_IF_ERROR(hook_(static_cast<int>(j), false));
  }
  return absl::OkStatus();
}

absl::Status Network::Loss(float label_smoothing, int count) {
  if (count < 0) count = batch_;
  if (training_ && count != batch_) {
    return absl::InvalidArgumentError("a training network takes the loss of the whole batch");
  }
  const int classes = model_->classes();
  const int k = std::min(5, classes);
  Value& out = values_[model_->output()];
  float* dlogits = training_ ? out.grad : nullptr;
  if (const kernels::CudaContext* cuda = model_->device()->cuda()) {
    TOPIARY_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropyCuda(
        batch_, classes, out.data.data(), labels_.data(), label_smoothing, dlogits,
        sample_loss_.data(), rank_.data(), *cuda));
    return kernels::AccumulateMetricsCuda(count, sample_loss_.data(), rank_.data(), k,
                                          metrics_.data(), *cuda);
  }
  // One pass gives the loss of the first `count` rows and, on a training network (where
  // count is the whole batch), the gradient of their mean.
  host_metrics_.loss_sum +=
      count * kernels::SoftmaxCrossEntropyCpu(count, classes, out.data.data(), labels_.data(),
                                              label_smoothing, dlogits);
  host_metrics_.top1 += kernels::TopKCorrectCpu(count, classes, out.data.data(), labels_.data(), 1);
  host_metrics_.top5 += kernels::TopKCorrectCpu(count, classes, out.data.data(), labels_.data(), k);
  host_metrics_.images += count;
  return absl::OkStatus();
}

absl::Status Network::Backward() {
  const auto& nodes = model_->nodes();
  const auto& shapes = model_->value_shapes();
  const kernels::CudaContext* cuda = model_->device()->cuda();
  for (size_t j = nodes.size(); j-- > 0;) {
    Value& out = values_[nodes[j].output];
    const int64_t n = static_cast<int64_t>(shapes[nodes[j].output].per_image()) * batch_;
    for (const float* extra : out.extra_grads) {
      if (cuda != nullptr) {
        TOPIARY_RETURN_IF_ERROR(kernels::AddCuda(n, out.grad, extra, out.grad, *cuda));
      } else {
        kernels::AddCpu(n, out.grad, extra, out.grad);
      }
    }
    TOPIARY_RETURN_IF_ERROR(nodes[j].layer->Backward(io_[j]));
    if (hook_) TOPIARY_RETURN_IF_ERROR(hook_(static_cast<int>(j), true));
  }
  return absl::OkStatus();
}

absl::StatusOr<Metrics> Network::TakeMetrics() {
  Metrics m = host_metrics_;
  host_metrics_ = Metrics{};
  if (model_->device()->cuda() != nullptr) {
    const std::vector<double> sums = metrics_.ToHost();  // waits for the stream
    m = Metrics{sums[0], sums[1], sums[2], sums[3]};
    const std::vector<double> zeros(4, 0.0);
    metrics_.CopyFromHost(zeros.data());
  }
  return m;
}

}  // namespace topiary
