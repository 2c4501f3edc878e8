#include "trainer/nn/graph.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/nn/layers.h"
#include "trainer/spec/catalog.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::LayerNode;
using topiary::v1::NetworkGraph;

// Bounds that keep a hostile graph from allocating without limit: they are far above any
// CNN of this tool's scope (resnet152 has 517 layers, 60 M parameters).
constexpr int kMaxLayers = 10000;
constexpr int kMaxInputs = 64;  // concat inputs
constexpr int kMaxChannels = 1 << 16;
constexpr int kMaxKernel = 31;  // kernel and pooling window side
constexpr int kMaxStride = 16;
constexpr int64_t kMaxLayerWeights = int64_t{1} << 27;   // 512 MB of fp32
constexpr int64_t kMaxModelWeights = int64_t{1} << 29;   // 2 GB of fp32
constexpr int64_t kMaxValueElements = int64_t{1} << 28;  // one image's activation

// Layer names become HDF5 group names and ONNX tensor names: a safe alphabet only.
bool GoodName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name == kGraphInput) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-' || c == ':';
    if (!ok) return false;
  }
  return true;
}

class GraphBuilder {
 public:
  GraphBuilder(Model* model, const std::string& what, int64_t max_values)
      : model_(model), what_(what), max_values_(max_values) {}

  absl::Status Add(const LayerNode& node) {
    const std::string at = absl::StrCat(what_, ": layer '", node.name(), "'");
    if (!GoodName(node.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          what_, ": layer name '", node.name().substr(0, 64),
          "' is not 1-200 characters of [A-Za-z0-9_.:-] (or is the reserved 'input')"));
    }
    if (values_.count(node.name())) return absl::InvalidArgumentError(at + ": duplicate name");
    const auto kind = LayerKindOf(node.kind());
    if (!kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": no kind (or one this build does not know, ", static_cast<int>(node.kind()), ")"));
    }
    std::vector<int> inputs;
    for (const std::string& in : node.inputs()) {
      auto v = values_.find(in);
      if (v == values_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, ": input '", in, "' is not 'input' or an earlier layer (a graph is in order)"));
      }
      inputs.push_back(v->second);
    }
    const int arity = static_cast<int>(inputs.size());
    const bool arity_ok = *kind == LayerKind::kAdd || *kind == LayerKind::kMul ? arity == 2
                          : *kind == LayerKind::kConcat ? arity >= 2 && arity <= kMaxInputs
                                                        : arity == 1;
    if (!arity_ok) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: a %s layer cannot read %d inputs", at, LayerKindName(*kind), arity));
    }
    TOPIARY_ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer, Make(*kind, node, inputs, at));
    const int out = model_->Add(std::move(layer), inputs);
    if (out < 0)
      return absl::InvalidArgumentError(absl::StrCat(what_, ": ", model_->status().message()));
    const Shape4& s = model_->value_shapes()[out];
    if (static_cast<int64_t>(s.per_image()) > kMaxValueElements) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: output %dx%dx%d is over %d elements per image", at, s.h, s.w, s.c,
                          kMaxValueElements));
    }
    if (node.original_out_channels() != 0) {
      if (node.out_channels() == 0 || node.original_out_channels() < node.out_channels() ||
          node.original_out_channels() > kMaxChannels) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: original_out_channels = %d is not in [out_channels = %d, %d]", at,
                            node.original_out_channels(), node.out_channels(), kMaxChannels));
      }
      model_->set_original_out_channels(node.name(), node.original_out_channels());
    }
    values_[node.name()] = out;
    return absl::OkStatus();
  }

  int value(const std::string& name) const { return values_.at(name); }

 private:
  static absl::Status Range(const std::string& at, const char* field, int64_t v, int64_t lo,
                            int64_t hi) {
    if (v >= lo && v <= hi) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s = %d is outside [%d, %d]", at, field, v, lo, hi));
  }

  // Checked before the layer's parameters exist: `weights` is its kernel's size (bounded per
  // layer and in all), `values` every value of its parameters (bounded by the caller's
  // budget, what the file they come from holds).
  absl::Status Parameters(const std::string& at, int64_t weights, int64_t values) {
    total_weights_ += weights;
    total_values_ += values;
    if (weights > kMaxLayerWeights || total_weights_ > kMaxModelWeights) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d weights (the network %d so far) is over the limit of %d per layer and %d in all",
          at, weights, total_weights_, kMaxLayerWeights, kMaxModelWeights));
    }
    if (max_values_ >= 0 && total_values_ > max_values_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the network needs %d parameter values up to here, but its file holds %d (a "
          "layer wider than its weights, or weights missing)",
          at, total_values_, max_values_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Conv2d::Config> ConvConfig(const LayerNode& n, const std::string& at) {
    TOPIARY_RETURN_IF_ERROR(Range(at, "out_channels", n.out_channels(), 1, kMaxChannels));
    TOPIARY_RETURN_IF_ERROR(Range(at, "kernel_h", n.kernel_h(), 1, kMaxKernel));
    TOPIARY_RETURN_IF_ERROR(Range(at, "kernel_w", n.kernel_w(), 1, kMaxKernel));
    TOPIARY_RETURN_IF_ERROR(Range(at, "stride", n.stride(), 1, kMaxStride));
    TOPIARY_RETURN_IF_ERROR(Range(at, "pad", n.pad(), 0, kMaxKernel));
    Conv2d::Config c;
    c.out_channels = n.out_channels();
    c.kernel_h = n.kernel_h();
    c.kernel_w = n.kernel_w();
    c.stride = n.stride();
    c.pad = n.pad();
    c.bias = n.bias();
    return c;
  }

  absl::StatusOr<std::unique_ptr<Layer>> Make(LayerKind kind, const LayerNode& n,
                                              const std::vector<int>& inputs,
                                              const std::string& at) {
    const int in_c = model_->value_shapes()[inputs[0]].c;
    switch (kind) {
      case LayerKind::kConv2d: {
        TOPIARY_ASSIGN_OR_RETURN(auto c, ConvConfig(n, at));
        const int64_t weights = int64_t{c.out_channels} * c.kernel_h * c.kernel_w * in_c;
        TOPIARY_RETURN_IF_ERROR(Parameters(at, weights, weights + (c.bias ? c.out_channels : 0)));
        return std::make_unique<Conv2d>(n.name(), c);
      }
      case LayerKind::kGroupedConv2d: {
        TOPIARY_ASSIGN_OR_RETURN(auto c, ConvConfig(n, at));
        TOPIARY_RETURN_IF_ERROR(Range(at, "groups", n.groups(), 2, kMaxChannels));
        if (in_c % n.groups() != 0 || c.out_channels % n.groups() != 0) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s: groups = %d does not divide the %d input and %d output channels",
                              at, n.groups(), in_c, c.out_channels));
        }
        const int64_t weights =
            int64_t{c.out_channels} * c.kernel_h * c.kernel_w * (in_c / n.groups());
        TOPIARY_RETURN_IF_ERROR(Parameters(at, weights, weights + (c.bias ? c.out_channels : 0)));
        return std::make_unique<GroupedConv2d>(n.name(), c, n.groups());
      }
      case LayerKind::kBatchNorm: {
        const float eps = n.epsilon() == 0 ? 1e-5f : n.epsilon();
        if (!(eps > 0 && eps <= 1)) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s: epsilon = %g is outside (0, 1]", at, eps));
        }
        // gamma, beta, running mean and variance
        TOPIARY_RETURN_IF_ERROR(Parameters(at, 0, int64_t{4} * in_c));
        return std::make_unique<BatchNorm2d>(n.name(), n.relu(), eps);
      }
      case LayerKind::kLinear:
        TOPIARY_RETURN_IF_ERROR(Range(at, "out_channels", n.out_channels(), 1, kMaxChannels));
        TOPIARY_RETURN_IF_ERROR(Parameters(at, int64_t{n.out_channels()} * in_c,
                                           int64_t{n.out_channels()} * (in_c + 1)));
        return std::make_unique<Linear>(n.name(), n.out_channels());
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool:
        TOPIARY_RETURN_IF_ERROR(Range(at, "window", n.window(), 1, kMaxKernel));
        TOPIARY_RETURN_IF_ERROR(Range(at, "stride", n.stride(), 1, kMaxStride));
        TOPIARY_RETURN_IF_ERROR(Range(at, "pad", n.pad(), 0, n.window() / 2));
        return std::make_unique<Pool2d>(
            n.name(), kind == LayerKind::kMaxPool ? Pool2d::Kind::kMax : Pool2d::Kind::kAvg,
            n.window(), n.stride(), n.pad());
      case LayerKind::kGlobalAvgPool:
        return std::make_unique<GlobalAvgPool>(n.name());
      case LayerKind::kRelu:
      case LayerKind::kRelu6:
        return std::make_unique<Relu>(n.name(), kind == LayerKind::kRelu6);
      case LayerKind::kAdd:
        return std::make_unique<topiary::Add>(n.name(), n.relu());
      case LayerKind::kConcat:
        return std::make_unique<Concat>(n.name());
      case LayerKind::kMul:
        return std::make_unique<topiary::Mul>(n.name());
      case LayerKind::kSigmoid:
      case LayerKind::kSilu:
      case LayerKind::kHardSwish:
        return std::make_unique<Activation>(n.name(), kind);
      case LayerKind::kLeakyRelu:
        if (!(std::abs(n.alpha()) <= 100)) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s: alpha = %g is not a slope in [-100, 100]", at, n.alpha()));
        }
        return std::make_unique<Activation>(n.name(), kind, n.alpha());
      case LayerKind::kHardSigmoid:
        if (!(n.alpha() > 0 && n.alpha() <= 100 && std::abs(n.beta()) <= 100)) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: alpha = %g, beta = %g: the slope must be in (0, 100] and the offset in "
              "[-100, 100]",
              at, n.alpha(), n.beta()));
        }
        return std::make_unique<Activation>(n.name(), kind, n.alpha(), n.beta());
      case LayerKind::kFlatten:
        return std::make_unique<Flatten>(n.name());
    }
    return absl::InternalError(at + ": unhandled kind");
  }

  Model* model_;
  std::string what_;
  std::map<std::string, int> values_ = {{kGraphInput, 0}};
  int64_t max_values_;
  int64_t total_weights_ = 0, total_values_ = 0;
};

}  // namespace

NetworkGraph DescribeModel(const Model& model) {
  NetworkGraph g;
  g.set_arch(model.arch());
  const Shape4& in = model.input_shape();
  g.set_height(in.h);
  g.set_width(in.w);
  g.set_channels(in.c);
  g.set_classes(model.classes());
  std::vector<std::string> names(model.value_shapes().size());
  names[0] = kGraphInput;
  for (const Model::Node& node : model.nodes()) {
    LayerNode* n = g.add_layers();
    node.layer->Describe(n);
    n->set_original_out_channels(model.original_out_channels(node.layer->name()));
    for (int v : node.inputs) n->add_inputs(names[v]);
    names[node.output] = node.layer->name();
  }
  return g;
}

absl::StatusOr<std::unique_ptr<Model>> BuildModelFromGraph(const NetworkGraph& g, Device* device,
                                                           const std::string& what,
                                                           int64_t max_parameter_values) {
  if (g.arch().empty() || g.arch().size() > 200) {
    return absl::InvalidArgumentError(what + ": arch must be 1-200 characters");
  }
  if (g.height() < 1 || g.height() > 4096 || g.width() < 1 || g.width() > 4096 ||
      g.channels() < 1 || g.channels() > 64 || g.classes() < 1 || g.classes() > kMaxClasses) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: input %dx%dx%d with %d classes is outside 1-4096 x 1-4096 x 1-64, 1-%d classes", what,
        g.height(), g.width(), g.channels(), g.classes(), kMaxClasses));
  }
  if (g.layers_size() < 1 || g.layers_size() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d layers (1-%d allowed)", what, g.layers_size(), kMaxLayers));
  }
  auto model = std::make_unique<Model>(g.arch(), device,
                                       Shape4{1, g.height(), g.width(), g.channels()}, g.classes());
  GraphBuilder builder(model.get(), what, max_parameter_values);
  for (const LayerNode& node : g.layers()) TOPIARY_RETURN_IF_ERROR(builder.Add(node));
  if (auto st = model->Finish(builder.value(g.layers().rbegin()->name())); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the last layer, '",
                                                   g.layers().rbegin()->name(),
                                                   "', is not the logits: ", st.message()));
  }
  return model;
}

}  // namespace topiary
