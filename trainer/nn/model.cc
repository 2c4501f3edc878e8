#include "trainer/nn/model.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/loss.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/memory_plan.h"
#include "trainer/nn/residual_tail.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

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

int Model::original_out_channels(const std::string& layer) const {
  auto it = original_out_channels_.find(layer);
  return it == original_out_channels_.end() ? 0 : it->second;
}

void Model::set_original_out_channels(const std::string& layer, int channels) {
  if (channels > 0) original_out_channels_[layer] = channels;
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

Network::Network(Model* model, int batch, bool training)
    : model_(model), batch_(batch), training_(training) {}
Network::~Network() = default;

absl::Status Network::Allocate(const PlanOptions& caller_options) {
  // The layers see the caller's options with this plan's search deadlines and counters.
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto after = [&](double seconds) {
    return start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(std::clamp(seconds, 0.0, 1e6)));
  };
  PlanOptions options = caller_options;
  options.stats = &plan_progress_;
  options.search_deadline = after(caller_options.search_seconds);
  options.refine_deadline = after(caller_options.refine_seconds);
  Device* dev = model_->device();
  const auto& shapes = model_->value_shapes();
  const auto& nodes = model_->nodes();
  const int num_nodes = static_cast<int>(nodes.size());
  dtype_ = kernels::ActivationType(options.precision);
  if (dtype_ == kernels::DType::kBf16 && dev->cuda() == nullptr) {
    return absl::InvalidArgumentError(
        "bf16 precision needs a GPU (the CPU backend computes in fp32 only)");
  }
  auto floats = [&](size_t count) -> absl::StatusOr<Buffer<float>> {
    planned_bytes_ += count * sizeof(float);
    return Buffer<float>::Create(dev, count);
  };
  // Activations and gradients share one arena, each buffer alive from the step that writes it
  // through the last step that reads it (memory_plan.h). Step j is node j's forward pass, step
  // N the loss, step 2N - j node j's backward pass; the input is written before step 0. A value
  // that no backward pass reads (Layer::backward_reads) is dead after its last forward reader,
  // and an inference network keeps nothing past the forward pass.
  const int n = num_nodes;
  const bool gpu = dev->cuda() != nullptr;
  const size_t elem = kernels::SizeOf(dtype_);
  const int num_values = static_cast<int>(shapes.size());
  auto bytes_of = [&](int v) { return shapes[v].per_image() * batch_ * elem; };
  std::vector<int> producer(num_values, -1);
  for (int j = 0; j < n; ++j) producer[nodes[j].output] = j;
  std::vector<Lifetime> lifetimes;
  for (int v = 0; v < num_values; ++v) {
    lifetimes.push_back({bytes_of(v), producer[v], producer[v]});  // the input: -1
  }
  auto extend = [&](int v, int step) { lifetimes[v].last = std::max(lifetimes[v].last, step); };
  // Residual tails: a folded batch norm writes no output, and the add reads its input.
  tail_of_.assign(n, -1);
  if (gpu && options.fuse_residual_tails) tails_ = ResidualTail::Find(*model_, dtype_);
  unfused_reason_ = !gpu                           ? "the CPU runs every layer on its own"
                    : !options.fuse_residual_tails ? "residual tails are not fused (PlanOptions)"
                                                   : "";
  for (size_t i = 0; i < tails_.size(); ++i) {
    tail_of_[tails_[i]->add()] = static_cast<int>(i);
    for (int k : {0, 1}) {
      const int bn = tails_[i]->batch_norm(k);
      if (bn < 0) continue;
      tail_of_[bn] = static_cast<int>(i);
      lifetimes[nodes[bn].output].bytes = 0;
      extend(nodes[bn].inputs[0], tails_[i]->add());
    }
  }
  // Convolution -> batch norm pairs: the convolution may write the batch norm's moments.
  moments_of_.assign(n, -1);
  moments_conv_.clear();
  if (gpu && training_ && dtype_ == kernels::DType::kBf16 && options.fuse_batch_norm_moments) {
    std::vector<int> readers(num_values, 0), reader(num_values, -1);
    for (int j = 0; j < n; ++j) {
      for (int v : nodes[j].inputs) ++readers[v], reader[v] = j;
    }
    for (int j = 0; j < n; ++j) {
      const int v = nodes[j].output;
      if (nodes[j].layer->kind() == LayerKind::kConv2d && readers[v] == 1 &&
          nodes[reader[v]].layer->kind() == LayerKind::kBatchNorm) {
        moments_of_[j] = moments_of_[reader[v]] = static_cast<int>(moments_conv_.size());
        moments_conv_.push_back(j);
      }
    }
  }
  moments_.assign(moments_conv_.size(), kernels::BatchNormMoments{});
  // Whether node j's input k is a folded batch norm's output whose gradient buffer the tail
  // never writes (the masked gradient goes to the other input's buffer, when it has one).
  auto unused_gradient = [&](int j, int k) {
    const int i = tail_of_[j];
    if (i < 0 || tails_[i]->add() != j || k != tails_[i]->a()) return false;
    return nodes[j].inputs[tails_[i]->b()] != 0;
  };
  extend(model_->output(), n);  // the loss reads the logits
  for (int j = 0; j < n; ++j) {
    const Layer::BackwardReads reads = nodes[j].layer->backward_reads(gpu);
    for (int v : nodes[j].inputs) {
      extend(v, j);
      if (training_ && reads.inputs) extend(v, 2 * n - j);
    }
    if (training_ && reads.output) extend(nodes[j].output, 2 * n - j);
  }
  // Gradients, in backward order (last node first). A value read by several nodes gets one
  // gradient buffer per reader: the first reader in forward order (the last to run backward)
  // owns the sum, the others' buffers are added into it before the producer's backward pass
  // (the role of Caffe's Split layer, without a layer). All live until that pass.
  struct GradUse {
    int value, node, input;  // node -1: the loss, writing the logits' gradient
  };
  std::vector<GradUse> grads;
  if (training_) {
    const int out = model_->output();
    grads.push_back({out, -1, 0});
    lifetimes.push_back({bytes_of(out), n, 2 * n - producer[out]});
    for (int j = n - 1; j >= 0; --j) {
      for (size_t k = 0; k < nodes[j].inputs.size(); ++k) {
        const int v = nodes[j].inputs[k];
        if (v == 0) continue;  // the network input needs no gradient
        grads.push_back({v, j, static_cast<int>(k)});
        // A folded batch norm's input gradient is written by its tail's add's backward pass.
        const int written = tail_of_[j] >= 0 ? tails_[tail_of_[j]]->add() : j;
        lifetimes.push_back({unused_gradient(j, static_cast<int>(k)) ? 0 : bytes_of(v),
                             2 * n - written, 2 * n - producer[v]});
      }
    }
  }
  const ArenaPlan plan = PackLifetimes(lifetimes);
  auto arena = Buffer<char>::Create(dev, plan.bytes);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(),
                        absl::StrFormat("activations and gradients (%s): %s",
                                        HumanBytes(plan.bytes), arena.status().message()));
  }
  arena_ = std::move(*arena);
  planned_bytes_ += plan.bytes;
  values_.resize(shapes.size());
  for (int v = 0; v < num_values; ++v) values_[v].data = arena_.data() + plan.offsets[v];
  input_ = reinterpret_cast<float*>(values_[0].data);
  if (dtype_ == kernels::DType::kBf16) {
    TOPIARY_ASSIGN_OR_RETURN(auto in, floats(shapes[0].per_image() * batch_));
    input_f32_ = std::move(in);
    input_ = input_f32_.data();
  }
  io_.resize(nodes.size());
  for (int j = 0; j < n; ++j) {
    LayerIo& io = io_[j];
    io.x.clear();
    for (int v : nodes[j].inputs) io.x.push_back(values_[v].data);
    io.dx.assign(nodes[j].inputs.size(), nullptr);
  }
  std::vector<int> consumers(shapes.size(), 0);
  for (int j = 0; j < n; ++j) {
    for (int v : nodes[j].inputs) ++consumers[v];
  }
  for (size_t g = 0; g < grads.size(); ++g) {
    void* buffer = arena_.data() + plan.offsets[num_values + g];
    const GradUse& use = grads[g];
    Value& val = values_[use.value];
    if (use.node < 0) {
      val.grad = buffer;
      continue;
    }
    if (--consumers[use.value] == 0) {
      val.grad = buffer;
    } else {
      val.extra_grads.push_back(buffer);
    }
    io_[use.node].dx[use.input] = buffer;
  }

  size_t workspace_bytes = 0;
  plan_progress_.layers_total = num_nodes;
  scratch_.resize(nodes.size());
  states_.resize(nodes.size());
  for (int j = 0; j < num_nodes; ++j) {
    LayerIo& io = io_[j];
    io.batch = batch_;
    io.cuda = dev->cuda();
    io.dtype = dtype_;
    io.y = values_[nodes[j].output].data;
    io.dy = training_ ? values_[nodes[j].output].grad : nullptr;
    // A value read by two layers whose producer can sum both gradients as it reads them
    // (the add + ReLU ending a residual block, whose output feeds the next block's first
    // convolution and its shortcut): one pass instead of a summing pass and the backward.
    Value& out = values_[nodes[j].output];
    const bool tail_add = tail_of_[j] >= 0 && tails_[tail_of_[j]]->add() == j;
    if (training_ && out.extra_grads.size() == 1 &&
        (nodes[j].layer->sums_output_gradients() || tail_add) &&
        std::all_of(io.dx.begin(), io.dx.end(), [](void* g) { return g != nullptr; })) {
      io.dy2 = out.extra_grads[0];
      out.producer_sums = true;
    }
    io.moments = moments_of_[j] >= 0 ? &moments_[moments_of_[j]] : nullptr;
    PlanOptions layer_options = options;
    layer_options.moments_for_batch_norm = WritesMoments(j);
    TOPIARY_ASSIGN_OR_RETURN(auto res, nodes[j].layer->Prepare(batch_, dev, layer_options));
    plan_progress_.layers_done = j + 1;
    if (options.progress) {
      plan_progress_.seconds = elapsed();
      options.progress(plan_progress_);
    }
    TOPIARY_ASSIGN_OR_RETURN(auto scratch, floats(res.scratch_floats));
    scratch_[j] = std::move(scratch);
    io.scratch = scratch_[j].data();
    states_[j] = std::move(res.state);
    io.state = states_[j].get();
    workspace_bytes = std::max(workspace_bytes, res.workspace_bytes);
  }
  for (auto& tail : tails_) {
    size_t bytes = 0;
    TOPIARY_RETURN_IF_ERROR(tail->Prepare(batch_, dev, options.batch_norm_ranks, &bytes));
    workspace_bytes = std::max(workspace_bytes, bytes);
  }
  TOPIARY_ASSIGN_OR_RETURN(auto ws, floats((workspace_bytes + sizeof(float) - 1) / sizeof(float)));
  workspace_ = std::move(ws);
  for (auto& io : io_) io.workspace = workspace_.data();

  if (dtype_ == kernels::DType::kBf16) TOPIARY_RETURN_IF_ERROR(PlanBf16Casts());

  TOPIARY_ASSIGN_OR_RETURN(auto labels, Buffer<int32_t>::Create(dev, batch_));
  labels_ = std::move(labels);
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
  // Activation-zero counters (Forward's count_input_zeros), made here so no pass allocates.
  input_elements_.assign(nodes.size(), 0);
  input_zeros_host_.assign(nodes.size(), 0);
  if (dev->cuda() != nullptr) {
    TOPIARY_ASSIGN_OR_RETURN(auto counts, Buffer<unsigned long long>::Create(dev, nodes.size()));
    input_zeros_ = std::move(counts);
    const std::vector<unsigned long long> zeros(nodes.size(), 0);
    input_zeros_.CopyFromHost(zeros.data());
  }
  plan_progress_.seconds = elapsed();
  return absl::OkStatus();
}

absl::Status Network::PlanBf16Casts() {
  Device* dev = model_->device();
  std::vector<kernels::CastItem> weights, grads;
  for (Parameter* p : model_->parameters()) {
    if (p->value_bf16.empty()) continue;
    weights.push_back({p->value.data(), p->value_bf16.data(), static_cast<int64_t>(p->size())});
    grads.push_back({p->grad_bf16.data(), p->grad.data(), static_cast<int64_t>(p->size())});
  }
  auto upload = [&](const std::vector<kernels::CastItem>& items,
                    Buffer<kernels::CastItem>* out) -> absl::Status {
    TOPIARY_ASSIGN_OR_RETURN(auto b, Buffer<kernels::CastItem>::Create(dev, items.size()));
    *out = std::move(b);
    if (!items.empty()) out->CopyFromHost(items.data());
    return absl::OkStatus();
  };
  TOPIARY_RETURN_IF_ERROR(upload(weights, &weight_casts_));
  if (!training_) return absl::OkStatus();  // inference computes no gradients
  return upload(grads, &grad_casts_);
}

absl::Status Network::Forward(bool training, int count_input_zeros) {
  const auto& nodes = model_->nodes();
  if (dtype_ == kernels::DType::kBf16) {
    // The masters may have changed since the last pass (an update, a load, a new mask).
    const kernels::CudaContext& cuda = *model_->device()->cuda();
    TOPIARY_RETURN_IF_ERROR(
        kernels::CastCuda(kernels::DType::kF32, kernels::DType::kBf16,
                          static_cast<int64_t>(model_->input_shape().per_image()) * batch_,
                          input_f32_.data(), values_[0].data, cuda));
    TOPIARY_RETURN_IF_ERROR(kernels::CastManyCuda(kernels::DType::kF32, kernels::DType::kBf16,
                                                  weight_casts_.data(),
                                                  static_cast<int>(weight_casts_.size()), cuda));
  }
  for (size_t j = 0; j < nodes.size(); ++j) {
    // Counted before the layer runs: the input's memory may be reused once it has.
    if (count_input_zeros > 0 && nodes[j].layer->kind() == LayerKind::kConv2d) {
      TOPIARY_RETURN_IF_ERROR(CountInputZeros(j, count_input_zeros));
    }
    if (input_hook_) TOPIARY_RETURN_IF_ERROR(input_hook_(static_cast<int>(j), io_[j]));
    const int tail = tail_of_[j];
    if (WritesMoments(static_cast<int>(j))) {
      moments_[moments_of_[j]] = kernels::BatchNormMoments{};  // until the convolution writes them
    }
    if (tail < 0) {
      TOPIARY_RETURN_IF_ERROR(nodes[j].layer->Forward(io_[j], training));
    } else if (tails_[tail]->add() == static_cast<int>(j)) {
      TOPIARY_RETURN_IF_ERROR(tails_[tail]->Forward(io_));
    } else {
      TOPIARY_RETURN_IF_ERROR(
          tails_[tail]->ForwardBatchNorm(static_cast<int>(j), io_[j], training));
    }
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
  void* dlogits = training_ ? out.grad : nullptr;
  if (const kernels::CudaContext* cuda = model_->device()->cuda()) {
    TOPIARY_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropyCuda(
        dtype_, batch_, classes, out.data, labels_.data(), label_smoothing, dlogits,
        sample_loss_.data(), rank_.data(), *cuda));
    return kernels::AccumulateMetricsCuda(count, sample_loss_.data(), rank_.data(), k,
                                          metrics_.data(), *cuda);
  }
  // One pass gives the loss of the first `count` rows and, on a training network (where
  // count is the whole batch), the gradient of their mean.
  const float* logits = static_cast<const float*>(out.data);
  host_metrics_.loss_sum +=
      count * kernels::SoftmaxCrossEntropyCpu(count, classes, logits, labels_.data(),
                                              label_smoothing, static_cast<float*>(dlogits));
  host_metrics_.top1 += kernels::TopKCorrectCpu(count, classes, logits, labels_.data(), 1);
  host_metrics_.top5 += kernels::TopKCorrectCpu(count, classes, logits, labels_.data(), k);
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
    for (const void* extra : out.extra_grads) {
      if (out.producer_sums) break;  // the layer adds it (LayerIo::dy2)
      if (cuda != nullptr) {
        TOPIARY_RETURN_IF_ERROR(kernels::AddCuda(dtype_, n, out.grad, extra, out.grad, *cuda));
      } else {
        float* g = static_cast<float*>(out.grad);
        kernels::AddCpu(n, g, static_cast<const float*>(extra), g);
      }
    }
    // A folded batch norm's backward pass ran in its tail's add's.
    const int tail = tail_of_[j];
    if (tail < 0) {
      TOPIARY_RETURN_IF_ERROR(nodes[j].layer->Backward(io_[j]));
    } else if (tails_[tail]->add() == static_cast<int>(j)) {
      TOPIARY_RETURN_IF_ERROR(tails_[tail]->Backward(io_));
    }
    if (hook_) TOPIARY_RETURN_IF_ERROR(hook_(static_cast<int>(j), true));
    if (reducer_) TOPIARY_RETURN_IF_ERROR(reducer_->LayerDone(static_cast<int>(j)));
  }
  if (reducer_) return reducer_->Finish();  // it widens bf16 gradients as it gathers them
  if (dtype_ == kernels::DType::kBf16) {    // the optimizer updates the fp32 masters
    return kernels::CastManyCuda(kernels::DType::kBf16, kernels::DType::kF32, grad_casts_.data(),
                                 static_cast<int>(grad_casts_.size()), *cuda);
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

std::vector<std::string> Network::PlanReport() const {
  const auto& nodes = model_->nodes();
  std::vector<std::string> lines;
  for (size_t j = 0; j < nodes.size(); ++j) {
    const Layer& layer = *nodes[j].layer;
    std::string runs;
    if (tail_of_[j] >= 0) {
      const ResidualTail& t = *tails_[tail_of_[j]];
      if (static_cast<int>(j) == t.add()) {
        std::vector<std::string> folded;
        for (int k = 0; k < 2; ++k) {
          if (t.batch_norm(k) >= 0) folded.push_back(nodes[t.batch_norm(k)].layer->name());
        }
        runs = absl::StrCat("fused residual tail: ", absl::StrJoin(folded, " and "),
                            " applied, added and activated in one pass each way");
      } else {
        runs = absl::StrCat("folded into the fused residual tail of ", nodes[t.add()].layer->name(),
                            ": its own passes compute statistics only");
      }
    } else if (const auto* conv = dynamic_cast<const Conv2d*>(&layer);
               conv != nullptr && conv->approximation() != nullptr) {
      runs = "approximate multiplier " + conv->approximation()->multiplier;
    } else if (states_[j] != nullptr) {
      runs = states_[j]->Describe();
    }
    if (moments_of_[j] >= 0 && layer.kind() == LayerKind::kBatchNorm) {
      runs += absl::StrCat(runs.empty() ? "" : "; ", "training statistics from ",
                           nodes[moments_conv_[moments_of_[j]]].layer->name(),
                           "'s moments where its forward pass writes them");
    }
    if (runs.empty() && layer.kind() == LayerKind::kAdd) {
      runs = unfused_reason_.empty()
                 ? "unfused: no input is a batch norm's output that only this add reads"
                 : "unfused: " + unfused_reason_;
    }
    lines.push_back(
        absl::StrCat(layer.name(), " (", layer.type(), ")", runs.empty() ? "" : ": ", runs));
  }
  return lines;
}

std::vector<std::pair<std::string, SparseConvChoice>> Network::SparseConvChoices() const {
  std::vector<std::pair<std::string, SparseConvChoice>> out;
  for (size_t i = 0; i < states_.size(); ++i) {
    const SparseConvChoice* c = states_[i] ? states_[i]->sparse_choice() : nullptr;
    if (c != nullptr) out.emplace_back(model_->nodes()[i].layer->name(), *c);
  }
  return out;
}

absl::Status Network::CountInputZeros(size_t j, int images) {
  const auto& nodes = model_->nodes();
  const kernels::CudaContext* cuda = model_->device()->cuda();
  const int64_t n = static_cast<int64_t>(model_->value_shapes()[nodes[j].inputs[0]].per_image()) *
                    std::min(images, batch_);
  input_elements_[j] += n;
  if (cuda != nullptr) {
    return kernels::CountZerosCuda(dtype_, n, io_[j].x[0], input_zeros_.data() + j, *cuda);
  }
  input_zeros_host_[j] += kernels::CountZerosCpu(n, io_[j].xf(0));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> Network::TakeConvInputZeros() {
  std::vector<std::pair<std::string, double>> out;
  if (std::all_of(input_elements_.begin(), input_elements_.end(),
                  [](int64_t n) { return n == 0; })) {
    return out;  // nothing counted since the last call
  }
  TOPIARY_RETURN_IF_ERROR(model_->device()->Synchronize());
  std::vector<int64_t> zeros = input_zeros_host_;
  if (!input_zeros_.empty()) {
    const std::vector<unsigned long long> device = input_zeros_.ToHost();
    for (size_t j = 0; j < zeros.size(); ++j) zeros[j] = static_cast<int64_t>(device[j]);
    const std::vector<unsigned long long> reset(zeros.size(), 0);
    input_zeros_.CopyFromHost(reset.data());
  }
  const auto& nodes = model_->nodes();
  for (size_t j = 0; j < nodes.size(); ++j) {
    if (input_elements_[j] == 0) continue;
    out.emplace_back(nodes[j].layer->name(),
                     static_cast<double>(zeros[j]) / static_cast<double>(input_elements_[j]));
  }
  std::fill(input_elements_.begin(), input_elements_.end(), 0);
  std::fill(input_zeros_host_.begin(), input_zeros_host_.end(), 0);
  return out;
}

}  // namespace topiary
