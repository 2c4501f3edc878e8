#include "trainer/export/onnx_export.h"

#include <google/protobuf/struct.pb.h>

#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "kernels/norm_pool/batch_norm.h"
#include "onnx/onnx.pb.h"
#include "protos/version.h"
#include "trainer/core/device.h"
#include "trainer/data/batcher.h"
#include "trainer/data/dataset.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/store/checkpoint.h"
#include "trainer/store/checkpoint_schema.h"
#include "trainer/store/inference.h"
#include "trainer/util/file_util.h"
#include "trainer/util/json.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// A CPU model's parameter values, in place; Values copies them (to be changed).
absl::Span<const float> HostValues(const Parameter& p) { return {p.value.data(), p.size()}; }
std::vector<float> Values(const Parameter& p) {
  return std::vector<float>(p.value.data(), p.value.data() + p.size());
}

// Builds the graph node by node; tensor names are layer names (and "logits" for the output).
class GraphWriter {
 public:
  GraphWriter(onnx::GraphProto* graph, OnnxExportSummary* summary)
      : graph_(graph), summary_(summary) {}

  void Initializer(const std::string& name, const std::vector<int64_t>& dims,
                   absl::Span<const float> values) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    // raw_data is little-endian, as x86 and ARM hosts store floats.
    t->set_raw_data(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
    summary_->initializer_floats += static_cast<int64_t>(values.size());
  }
  // An int64 tensor (shapes and axes).
  void IntInitializer(const std::string& name, const std::vector<int64_t>& values) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
  }

  onnx::NodeProto* Node(const std::string& op, const std::string& name,
                        const std::vector<std::string>& inputs, const std::string& output) {
    onnx::NodeProto* n = graph_->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const std::string& in : inputs) n->add_input(in);
    n->add_output(output);
    ++summary_->nodes;
    return n;
  }

  static void Ints(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void Int(onnx::NodeProto* n, const std::string& name, int64_t v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void Float(onnx::NodeProto* n, const std::string& name, float v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }

  // A float tensor input or output of the graph: [batch, dims...].
  static void Io(onnx::ValueInfoProto* v, const std::string& name, int batch,
                 const std::vector<int64_t>& dims) {
    v->set_name(name);
    onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    onnx::TensorShapeProto* shape = t->mutable_shape();
    if (batch > 0) {
      shape->add_dim()->set_dim_value(batch);
    } else {
      shape->add_dim()->set_dim_param("batch");
    }
    for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
  }

 private:
  onnx::GraphProto* graph_;
  OnnxExportSummary* summary_;
};

// Zeros and masked entries of a conv or linear kernel.
void CountZeros(const Parameter& p, OnnxExportSummary* summary) {
  for (size_t i = 0; i < p.size(); ++i) summary->zeros += p.value.data()[i] == 0.0f;
  if (!p.mask.empty()) {
    for (size_t i = 0; i < p.mask.size(); ++i) summary->masked += p.mask.data()[i] == 0;
  }
}

std::vector<int64_t> ChannelDims(int c) { return {1, c, 1, 1}; }

// Batch norm as a per-channel scale and shift of its input (PyTorch's inference formula).
struct BnAffine {
  std::vector<double> scale, shift;
};
BnAffine AffineOf(BatchNorm2d* norm) {
  const std::vector<float> gamma = Values(*norm->parameter(ParamRole::kGamma)),
                           beta = Values(*norm->parameter(ParamRole::kBeta)),
                           mean = Values(*norm->parameter(ParamRole::kRunningMean)),
                           var = Values(*norm->parameter(ParamRole::kRunningVar));
  const double eps = norm->eps();
  BnAffine a;
  for (size_t k = 0; k < gamma.size(); ++k) {
    a.scale.push_back(gamma[k] / std::sqrt(static_cast<double>(var[k]) + eps));
    a.shift.push_back(beta[k] - mean[k] * a.scale.back());
  }
  return a;
}

// Walks the model's nodes in order and writes one or a few ONNX nodes for each. Tensor names
// are layer names; a layer's fused ReLU reads LAYER.pre_relu; the model's output is "logits".
class ModelToOnnx {
 public:
  ModelToOnnx(const Model& model, const OnnxExportOptions& options, onnx::GraphProto* graph,
              OnnxExportSummary* summary)
      : model_(model),
        options_(options),
        nodes_(model.nodes()),
        g_(graph, summary),
        summary_(summary),
        names_(model.value_shapes().size()),
        consumers_(names_.size(), 0),
        producer_(names_.size(), -1),
        flat_(names_.size(), false),
        done_(nodes_.size(), false) {
    for (size_t j = 0; j < nodes_.size(); ++j) {
      for (int v : nodes_[j].inputs) ++consumers_[v];
      producer_[nodes_[j].output] = static_cast<int>(j);
    }
  }

  // The batcher's arithmetic, in its order and in float32: (v * (1 / max_value) - mean) *
  // inv_std, so a runtime fed raw pixels sees what the network was trained on.
  void Normalization(const topiary::v1::InputFormat& input) {
    const int c = model_.input_shape().c;
    g_.Initializer("input.scale", ChannelDims(c), std::vector<float>(c, 1.0f / input.max_value()));
    g_.Initializer("input.mean", ChannelDims(c), input.mean());
    g_.Initializer("input.inv_std", ChannelDims(c), input.inv_std());
    g_.Node("Mul", "input.scale", {"input", "input.scale"}, "input.scaled");
    g_.Node("Sub", "input.center", {"input.scaled", "input.mean"}, "input.centered");
    g_.Node("Mul", "input.normalize", {"input.centered", "input.inv_std"}, "input.normalized");
    names_[0] = "input.normalized";
  }

  void Layers() {
    for (size_t j = 0; j < nodes_.size(); ++j) {
      if (done_[j]) continue;
      done_[j] = true;
      switch (nodes_[j].layer->kind()) {
        case LayerKind::kConv2d:
        case LayerKind::kGroupedConv2d:
          Conv(j);
          break;
        case LayerKind::kRelu6:
          flat_[nodes_[j].output] = flat_[nodes_[j].inputs[0]];
          Relu6(j);
          break;
        case LayerKind::kConcat:
          GraphWriter::Int(Simple(j, "Concat"), "axis", 1);  // NCHW channels
          break;
        case LayerKind::kBatchNorm:
          BatchNorm(j);
          break;
        case LayerKind::kLinear:
          Gemm(j);
          break;
        case LayerKind::kRelu:
          flat_[nodes_[j].output] = flat_[nodes_[j].inputs[0]];
          Simple(j, "Relu");
          break;
        case LayerKind::kAdd:
          Simple(j, "Add", static_cast<Add*>(nodes_[j].layer)->fused_relu());
          break;
        case LayerKind::kMaxPool:
          Pool(j, "MaxPool");
          break;
        case LayerKind::kAvgPool:
          // Topiary's average pooling counts padding as zeros.
          GraphWriter::Int(Pool(j, "AveragePool"), "count_include_pad", 1);
          break;
        case LayerKind::kGlobalAvgPool:
          Simple(j, "GlobalAveragePool");
          break;
        case LayerKind::kFlatten:
          GraphWriter::Int(Simple(j, "Flatten"), "axis", 1);
          flat_[nodes_[j].output] = true;
          break;
        case LayerKind::kSigmoid:
        case LayerKind::kSilu:
        case LayerKind::kLeakyRelu:
        case LayerKind::kHardSigmoid:
        case LayerKind::kHardSwish:
          flat_[nodes_[j].output] = flat_[nodes_[j].inputs[0]];
          Activation(j);
          break;
        case LayerKind::kMul:
          Product(j);
          break;
      }
    }
  }

 private:
  const std::string& Input(size_t j, int i = 0) const { return names_[nodes_[j].inputs[i]]; }

  // The node for `layer` (producing `value`) reading `inputs`; with `relu`, a Relu after it.
  onnx::NodeProto* Emit(const std::string& op, const std::string& layer, int value,
                        const std::vector<std::string>& inputs, bool relu = false) {
    const std::string out = value == model_.output() ? std::string("logits") : layer;
    onnx::NodeProto* n = g_.Node(op, layer, inputs, relu ? layer + ".pre_relu" : out);
    if (relu) g_.Node("Relu", layer + ".relu", {layer + ".pre_relu"}, out);
    names_[value] = out;
    return n;
  }

  onnx::NodeProto* Simple(size_t j, const std::string& op, bool relu = false) {
    std::vector<std::string> inputs;
    for (size_t i = 0; i < nodes_[j].inputs.size(); ++i) inputs.push_back(Input(j, i));
    return Emit(op, nodes_[j].layer->name(), nodes_[j].output, inputs, relu);
  }

  onnx::NodeProto* Pool(size_t j, const std::string& op) {
    auto* pool = static_cast<Pool2d*>(nodes_[j].layer);
    onnx::NodeProto* n = Simple(j, op);
    GraphWriter::Ints(n, "kernel_shape", {pool->window(), pool->window()});
    GraphWriter::Ints(n, "strides", {pool->stride(), pool->stride()});
    GraphWriter::Ints(n, "pads", {pool->pad(), pool->pad(), pool->pad(), pool->pad()});
    return n;
  }

  // The batch norm that alone reads node j's output, if folding is on; else -1.
  int FoldableBatchNorm(size_t j) const {
    const int out = nodes_[j].output;
    if (!options_.fold_batch_norm || consumers_[out] != 1) return -1;
    for (size_t k = j + 1; k < nodes_.size(); ++k) {
      if (nodes_[k].inputs[0] == out) {
        return nodes_[k].layer->kind() == LayerKind::kBatchNorm ? static_cast<int>(k) : -1;
      }
    }
    return -1;
  }

  // Opset 13 has Sigmoid, LeakyRelu and HardSigmoid; SiLU is x * Sigmoid(x) and hard swish
  // x * HardSigmoid(x) with alpha 1/6, beta 1/2 (HardSwish itself is opset 14), as PyTorch's
  // exports spell them.
  void Activation(size_t j) {
    const auto* act = static_cast<const topiary::Activation*>(nodes_[j].layer);
    const kernels::ActivationFn& f = act->params();
    const std::string& name = act->name();
    const int value = nodes_[j].output;
    switch (f.kind) {
      case kernels::ActivationKind::kSigmoid:
        Emit("Sigmoid", name, value, {Input(j)});
        return;
      case kernels::ActivationKind::kLeakyRelu:
        GraphWriter::Float(Emit("LeakyRelu", name, value, {Input(j)}), "alpha", f.alpha);
        return;
      case kernels::ActivationKind::kHardSigmoid: {
        onnx::NodeProto* n = Emit("HardSigmoid", name, value, {Input(j)});
        GraphWriter::Float(n, "alpha", f.alpha);
        GraphWriter::Float(n, "beta", f.beta);
        return;
      }
      case kernels::ActivationKind::kSilu:
        g_.Node("Sigmoid", name + ".gate", {Input(j)}, name + ".gate");
        break;
      case kernels::ActivationKind::kHardSwish: {
        onnx::NodeProto* n = g_.Node("HardSigmoid", name + ".gate", {Input(j)}, name + ".gate");
        GraphWriter::Float(n, "alpha", 1.0f / 6.0f);
        GraphWriter::Float(n, "beta", 0.5f);
        break;
      }
    }
    Emit("Mul", name, value, {Input(j), name + ".gate"});
  }

  // Mul: ONNX broadcasts a per-channel scale [N, C, 1, 1] over the map by itself; a flat
  // scale ([N, C], after a linear layer) is unsqueezed to that first.
  void Product(size_t j) {
    const std::string& name = nodes_[j].layer->name();
    std::vector<std::string> in = {Input(j, 0), Input(j, 1)};
    const bool flat0 = flat_[nodes_[j].inputs[0]], flat1 = flat_[nodes_[j].inputs[1]];
    if (flat0 != flat1) {
      const int k = flat0 ? 0 : 1;
      g_.IntInitializer(name + ".axes", {2, 3});
      g_.Node("Unsqueeze", name + ".unflatten", {in[k], name + ".axes"}, name + ".unflattened");
      in[k] = name + ".unflattened";
    }
    flat_[nodes_[j].output] = flat0 && flat1;
    Emit("Mul", name, nodes_[j].output, in);
  }

  // Clip with its bounds as inputs (opset 11 and later).
  void Relu6(size_t j) {
    const std::string& name = nodes_[j].layer->name();
    g_.Initializer(name + ".min", {}, std::vector<float>{0.0f});
    g_.Initializer(name + ".max", {}, std::vector<float>{6.0f});
    Emit("Clip", name, nodes_[j].output, {Input(j), name + ".min", name + ".max"});
  }

  // Conv2d or GroupedConv2d (the group attribute), with the batch norm after it folded in
  // when asked.
  void Conv(size_t j) {
    const Layer* op = nodes_[j].layer;
    const bool grouped = op->kind() == LayerKind::kGroupedConv2d;
    const auto* conv = grouped ? nullptr : static_cast<const Conv2d*>(op);
    const Conv2d::Config& cfg =
        grouped ? static_cast<const GroupedConv2d*>(op)->config() : conv->config();
    const int groups = grouped ? static_cast<const GroupedConv2d*>(op)->groups() : 1;
    const Parameter& kernel = *op->parameter(ParamRole::kKernel);
    const Parameter* bias_param = op->parameter(ParamRole::kBias);
    const std::string& name = op->name();
    CountZeros(kernel, summary_);
    if (conv && conv->approximation() != nullptr) summary_->approximate_layers.push_back(name);
    FloatArray w = ToDisk(kernel, kernel.value.data(), kernel.size());  // OIHW
    const int K = cfg.out_channels;
    std::vector<float> b = bias_param ? Values(*bias_param) : std::vector<float>(K, 0.0f);
    bool has_bias = bias_param != nullptr;
    // Folding: W' = W * s, b' = b * s + shift per output channel, in double. 0 * s stays an
    // exact zero, so masked weights survive.
    std::string layer = name;
    int value = nodes_[j].output;
    bool relu = false;
    if (const int bn = FoldableBatchNorm(j); bn >= 0) {
      auto* norm = static_cast<BatchNorm2d*>(nodes_[bn].layer);
      const BnAffine a = AffineOf(norm);
      const size_t per_filter = w.size() / K;
      for (int k = 0; k < K; ++k) {
        for (size_t i = 0; i < per_filter; ++i) {
          w[k * per_filter + i] = static_cast<float>(w[k * per_filter + i] * a.scale[k]);
        }
        b[k] = static_cast<float>(b[k] * a.scale[k] + a.shift[k]);
      }
      has_bias = true;
      done_[bn] = true;
      ++summary_->folded;
      layer = norm->name();
      value = nodes_[bn].output;
      relu = norm->fused_relu();
    }
    std::vector<std::string> inputs = {Input(j), name + ".weight"};
    g_.Initializer(inputs[1], {K, kernel.value.shape()[3], cfg.kernel_h, cfg.kernel_w}, w);
    if (has_bias) {
      inputs.push_back(name + ".bias");
      g_.Initializer(inputs[2], {K}, b);
    }
    onnx::NodeProto* n = Emit("Conv", layer, value, inputs, relu);
    n->set_name(name);
    GraphWriter::Ints(n, "kernel_shape", {cfg.kernel_h, cfg.kernel_w});
    GraphWriter::Ints(n, "strides", {cfg.stride, cfg.stride});
    GraphWriter::Ints(n, "pads", {cfg.pad, cfg.pad, cfg.pad, cfg.pad});
    GraphWriter::Ints(n, "dilations", {1, 1});
    GraphWriter::Int(n, "group", groups);
  }

  void BatchNorm(size_t j) {
    auto* norm = static_cast<BatchNorm2d*>(nodes_[j].layer);
    std::vector<std::string> inputs = {Input(j)};
    for (ParamRole role :
         {ParamRole::kGamma, ParamRole::kBeta, ParamRole::kRunningMean, ParamRole::kRunningVar}) {
      const Parameter& p = *norm->parameter(role);
      inputs.push_back(absl::StrCat(norm->name(), ".", ParamRoleName(role)));
      g_.Initializer(inputs.back(), {static_cast<int64_t>(p.size())}, HostValues(p));
    }
    onnx::NodeProto* n =
        Emit("BatchNormalization", norm->name(), nodes_[j].output, inputs, norm->fused_relu());
    GraphWriter::Float(n, "epsilon", norm->eps());
    GraphWriter::Float(n, "momentum", 0.9f);  // ONNX's momentum weighs the old statistic
  }

  void Gemm(size_t j) {
    auto* fc = static_cast<Linear*>(nodes_[j].layer);
    const std::string& name = fc->name();
    const Parameter& kernel = *fc->parameter(ParamRole::kKernel);
    CountZeros(kernel, summary_);
    const int rows = kernel.value.shape()[0], cols = kernel.value.shape()[1];
    std::vector<float> w = Values(kernel);
    const int src = nodes_[j].inputs[0];
    std::string x = Input(j);
    const int p = producer_[src];
    if (p >= 0 && nodes_[p].layer->kind() == LayerKind::kFlatten) {
      // Topiary flattens NHWC (h, w, c); ONNX's Flatten of NCHW gives (c, h, w): the columns
      // are reordered to match.
      const Shape4 f = model_.value_shapes()[nodes_[p].inputs[0]];
      const std::vector<float> hwc = w;
      for (int r = 0; r < rows; ++r)
        for (int y = 0; y < f.h; ++y)
          for (int q = 0; q < f.w; ++q)
            for (int c = 0; c < f.c; ++c)
              w[static_cast<size_t>(r) * cols + (c * f.h + y) * f.w + q] =
                  hwc[static_cast<size_t>(r) * cols + (y * f.w + q) * f.c + c];
    } else if (!flat_[src]) {
      // A [N, C, 1, 1] input (after global pooling): Gemm wants [N, C].
      GraphWriter::Int(g_.Node("Flatten", name + ".flatten", {x}, name + ".flat"), "axis", 1);
      x = name + ".flat";
    }
    g_.Initializer(name + ".weight", {rows, cols}, w);
    g_.Initializer(name + ".bias", {rows}, HostValues(*fc->parameter(ParamRole::kBias)));
    GraphWriter::Int(Emit("Gemm", name, nodes_[j].output, {x, name + ".weight", name + ".bias"}),
                     "transB", 1);
    flat_[nodes_[j].output] = true;
  }

  const Model& model_;
  const OnnxExportOptions& options_;
  const std::vector<Model::Node>& nodes_;
  GraphWriter g_;
  OnnxExportSummary* summary_;
  std::vector<std::string> names_;  // per value: the tensor holding it
  std::vector<int> consumers_;      // per value
  std::vector<int> producer_;       // per value: its node, -1 for the input
  std::vector<bool> flat_;          // per value: [N, features] in the graph (after Gemm, Flatten)
  std::vector<bool> done_;          // per node (a folded batch norm is done with its conv)
};

}  // namespace

absl::StatusOr<OnnxExportSummary> ExportOnnx(
    const Model& model, const topiary::v1::InputFormat& input, const OnnxExportOptions& options,
    const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& path) {
  if (model.device()->kind() != DeviceKind::kCpu) {
    return absl::InternalError("ExportOnnx reads parameters from a CPU model");
  }
  const Shape4& in = model.input_shape();
  if (input.height() != in.h || input.width() != in.w || input.channels() != in.c ||
      input.mean_size() != in.c || input.inv_std_size() != in.c || !(input.max_value() > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "input: the checkpoint's input format (%dx%dx%d, %d means, %d scales, max %g) does not "
        "fit the model's %dx%dx%d input",
        input.height(), input.width(), input.channels(), input.mean_size(), input.inv_std_size(),
        input.max_value(), in.h, in.w, in.c));
  }
  for (int c = 0; c < in.c; ++c) {
    if (!std::isfinite(input.mean(c)) || !std::isfinite(input.inv_std(c))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("input: channel %d's mean or scale is not finite", c));
    }
  }
  if (options.batch < 0) return absl::InvalidArgumentError("--batch: must be >= 0");

  OnnxExportSummary summary;
  summary.parameters = model.trainable_parameter_count();
  onnx::ModelProto proto;
  proto.set_ir_version(kOnnxIrVersion);
  proto.set_producer_name("topiary");
  proto.set_producer_version(kTopiaryVersion);
  proto.set_model_version(1);
  proto.set_doc_string(absl::StrCat(model.arch(), " exported by topiary ", kTopiaryVersion,
                                    ": input 'input' is raw pixel values (0..max_value, NCHW, "
                                    "float32); output 'logits'"));
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  for (const auto& [key, value] : metadata) {
    onnx::StringStringEntryProto* e = proto.add_metadata_props();
    e->set_key(key);
    e->set_value(value);
  }
  onnx::GraphProto* graph = proto.mutable_graph();
  graph->set_name(model.arch());
  GraphWriter::Io(graph->add_input(), "input", options.batch, {in.c, in.h, in.w});
  ModelToOnnx writer(model, options, graph, &summary);
  writer.Normalization(input);
  writer.Layers();
  GraphWriter::Io(graph->add_output(), "logits", options.batch, {model.classes()});

  std::string bytes;
  if (!proto.SerializeToString(&bytes)) {
    return absl::InternalError("the ONNX model did not serialize (over 2 GiB?)");
  }
  summary.bytes = static_cast<int64_t>(bytes.size());
  TOPIARY_RETURN_IF_ERROR(WriteFileAtomic(path, bytes));
  return summary;
}

absl::StatusOr<OnnxExportSummary> ExportCheckpointToOnnx(const std::string& checkpoint,
                                                         const OnnxExportOptions& options,
                                                         const std::string& path) {
  TOPIARY_ASSIGN_OR_RETURN(const InferenceCheckpoint opened, OpenForInference(checkpoint));
  const H5Document& doc = opened.file.doc;
  const CheckpointState& state = opened.file.state;
  const topiary::v1::ExperimentSpec& spec = opened.spec;

  topiary::v1::InputFormat input;
  if (state.input) {
    input = *state.input;
  } else {
    // Written before checkpoints recorded their input: the run's normalization again.
    auto data = LoadDataset(spec.data(), spec.seed());
    if (!data.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(checkpoint,
                       ": has no /@input (an older checkpoint) and its training set, needed for "
                       "the normalization, is not readable: ",
                       data.status().message()));
    }
    input =
        DescribeInput(data->train, data->classes, data->max_value,
                      ComputeNormalization(data->train, data->max_value, spec.data().normalize()));
  }
  if (input.height() < 1 || input.height() > 4096 || input.width() < 1 || input.width() > 4096 ||
      input.channels() < 1 || input.channels() > 64 || input.classes() < 1 ||
      input.classes() > 100000) {
    return absl::DataLossError(absl::StrFormat("%s: /@input: implausible %dx%dx%d, %d classes",
                                               checkpoint, input.height(), input.width(),
                                               input.channels(), input.classes()));
  }
  topiary::v1::DeviceSpec cpu;
  cpu.set_kind(topiary::v1::DeviceSpec::CPU);
  TOPIARY_ASSIGN_OR_RETURN(auto device, CreateDevice(cpu));
  TOPIARY_ASSIGN_OR_RETURN(
      auto model, InferenceModel(opened, Shape4{1, input.height(), input.width(), input.channels()},
                                 input.classes(), device.get(), /*load=*/true));

  // Approximate layers are exported exact; how they were approximated goes in the metadata,
  // so that a hardware flow reading the graph knows each layer's multiplier and codes.
  std::vector<std::string> approximate;
  google::protobuf::Struct approximation;
  for (const auto& [group, attrs] : doc.groups) {
    if (!attrs.count(kMultiplierAttr) || group.rfind(kLayersPrefix, 0) != 0) continue;
    const std::string layer = group.substr(std::strlen(kLayersPrefix));
    approximate.push_back(layer);
    auto& fields =
        *(*approximation.mutable_fields())[layer].mutable_struct_value()->mutable_fields();
    for (const char* key : {kMultiplierAttr, kMultiplierSha256Attr, kWeightCodeAttr,
                            kWeightScalesAttr, kActivationRangeAttr}) {
      fields[key].set_string_value(AttrString(attrs, key));
    }
    fields[kWeightTuningAttr].set_bool_value(AttrInt(attrs, kWeightTuningAttr) != 0);
  }
  const std::vector<std::pair<std::string, std::string>> metadata = {
      {"topiary.model_arch", state.model_arch},
      {"topiary.experiment", state.experiment_id},
      {"topiary.round", std::to_string(state.position.round)},
      {"topiary.epoch", std::to_string(state.position.epoch)},
      {"topiary.metrics", ToJson(state.metrics)},
      {"topiary.input", ToJson(input)},
      {"topiary.batch_norm", options.fold_batch_norm ? "folded" : "kept"},
      {"topiary.approximate_layers_exported_exact", absl::StrJoin(approximate, ",")},
      {"topiary.approximation", ToJson(approximation)},
  };
  TOPIARY_ASSIGN_OR_RETURN(auto summary, ExportOnnx(*model, input, options, metadata, path));
  summary.approximate_layers = approximate;
  return summary;
}

}  // namespace topiary
