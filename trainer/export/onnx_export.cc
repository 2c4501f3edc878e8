#include "trainer/export/onnx_export.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/batch_norm.h"
#include "kernels/status_macros.h"
#include "onnx/onnx.pb.h"
#include "protos/version.h"
#include "trainer/core/device.h"
#include "trainer/data/batcher.h"
#include "trainer/data/dataset.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/spec/spec.h"
#include "trainer/store/checkpoint.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

const Parameter* Param(Layer* layer, ParamRole role) {
  for (Parameter* p : layer->parameters()) {
    if (p->role == role) return p;
  }
  return nullptr;
}

std::vector<float> Values(const Parameter& p) {
  return std::vector<float>(p.value.data(), p.value.data() + p.size());
}

// Builds the graph node by node; tensor names are layer names (and "logits" for the output).
class GraphWriter {
 public:
  GraphWriter(onnx::GraphProto* graph, OnnxExportSummary* summary)
      : graph_(graph), summary_(summary) {}

  void Initializer(const std::string& name, const std::vector<int64_t>& dims,
                   const std::vector<float>& values) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    // raw_data is little-endian, as x86 and ARM hosts store floats.
    t->set_raw_data(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
    summary_->parameters += static_cast<int64_t>(values.size());
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

// Conv kernel [K, R, S, C] in memory -> OIHW [K, C, R, S].
std::vector<float> KernelOihw(const Parameter& p) {
  const auto& s = p.value.shape();
  const int K = s[0], R = s[1], S = s[2], C = s[3];
  std::vector<float> out(p.size());
  const float* src = p.value.data();
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < S; ++q)
        for (int c = 0; c < C; ++c)
          out[((static_cast<size_t>(k) * C + c) * R + r) * S + q] =
              src[((static_cast<size_t>(k) * R + r) * S + q) * C + c];
  return out;
}

// Zeros and masked entries of a conv or linear kernel.
void CountZeros(const Parameter& p, OnnxExportSummary* summary) {
  for (size_t i = 0; i < p.size(); ++i) summary->zeros += p.value.data()[i] == 0.0f;
  if (!p.mask.empty()) {
    for (size_t i = 0; i < p.mask.size(); ++i) summary->masked += p.mask.data()[i] == 0;
  }
}

std::vector<int64_t> ChannelDims(int c) { return {1, c, 1, 1}; }

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
  GraphWriter g(graph, &summary);
  GraphWriter::Io(graph->add_input(), "input", options.batch, {in.c, in.h, in.w});

  // The batcher's arithmetic, in its order: (v * (1 / max_value) - mean) * inv_std.
  const int C = in.c;
  g.Initializer("input.scale", ChannelDims(C), std::vector<float>(C, 1.0f / input.max_value()));
  g.Initializer("input.mean", ChannelDims(C), {input.mean().begin(), input.mean().end()});
  g.Initializer("input.inv_std", ChannelDims(C), {input.inv_std().begin(), input.inv_std().end()});
  g.Node("Mul", "input.scale", {"input", "input.scale"}, "input.scaled");
  g.Node("Sub", "input.center", {"input.scaled", "input.mean"}, "input.centered");
  g.Node("Mul", "input.normalize", {"input.centered", "input.inv_std"}, "input.normalized");

  const auto& nodes = model.nodes();
  std::vector<std::string> names(model.value_shapes().size());
  names[0] = "input.normalized";
  std::vector<int> consumers(names.size(), 0), producer(names.size(), -1);
  for (size_t j = 0; j < nodes.size(); ++j) {
    for (int v : nodes[j].inputs) ++consumers[v];
    producer[nodes[j].output] = static_cast<int>(j);
  }
  auto out_name = [&](int value, const std::string& layer) {
    return value == model.output() ? std::string("logits") : layer;
  };
  // The ReLU a layer fused (its input is LAYER.pre_relu); returns the tensor to read.
  auto relu_after = [&](const std::string& layer, int value) {
    const std::string out = out_name(value, layer);
    g.Node("Relu", layer + ".relu", {layer + ".pre_relu"}, out);
    return out;
  };
  std::vector<bool> done(nodes.size(), false);
  // Values that are [N, features] in the ONNX graph (after Flatten or Gemm; ReLU keeps it).
  std::vector<bool> flat(names.size(), false);

  for (size_t j = 0; j < nodes.size(); ++j) {
    if (done[j]) continue;
    Layer* layer = nodes[j].layer;
    const std::string& name = layer->name();
    const int out = nodes[j].output;
    const std::string x = names[nodes[j].inputs[0]];
    switch (layer->kind()) {
      case LayerKind::kConv2d: {
        const auto* conv = static_cast<const Conv2d*>(layer);
        const Conv2d::Config& cfg = conv->config();
        const Parameter& kernel = *conv->kernel();
        CountZeros(kernel, &summary);
        if (conv->approximation() != nullptr) summary.approximate_layers.push_back(name);
        std::vector<float> w = KernelOihw(kernel);
        const int K = cfg.out_channels;
        const size_t per_filter = w.size() / K;
        std::vector<float> b(K, 0.0f);
        if (conv->bias() != nullptr) b = Values(*conv->bias());
        bool has_bias = conv->bias() != nullptr;
        // Folding: the batch norm that alone reads this convolution becomes its scale and bias.
        int bn = -1;
        if (options.fold_batch_norm && consumers[out] == 1) {
          for (size_t k = j + 1; k < nodes.size(); ++k) {
            if (nodes[k].inputs.size() == 1 && nodes[k].inputs[0] == out &&
                nodes[k].layer->kind() == LayerKind::kBatchNorm) {
              bn = static_cast<int>(k);
              break;
            }
          }
        }
        std::string result_layer = name;
        int result_value = out;
        bool relu = false;
        if (bn >= 0) {
          auto* norm = static_cast<BatchNorm2d*>(nodes[bn].layer);
          const std::vector<float> gamma = Values(*Param(norm, ParamRole::kGamma)),
                                   beta = Values(*Param(norm, ParamRole::kBeta)),
                                   mean = Values(*Param(norm, ParamRole::kRunningMean)),
                                   var = Values(*Param(norm, ParamRole::kRunningVar));
          const double eps = kernels::BatchNormShape{}.eps;
          for (int k = 0; k < K; ++k) {
            const double scale = gamma[k] / std::sqrt(static_cast<double>(var[k]) + eps);
            // 0 * scale stays an exact zero: masked weights survive folding.
            for (size_t i = 0; i < per_filter; ++i) {
              float& v = w[k * per_filter + i];
              v = static_cast<float>(v * scale);
            }
            b[k] = static_cast<float>((b[k] - mean[k]) * scale + beta[k]);
          }
          has_bias = true;
          done[bn] = true;
          ++summary.folded;
          result_layer = norm->name();
          result_value = nodes[bn].output;
          relu = norm->fused_relu();
        }
        const std::string y =
            relu ? absl::StrCat(result_layer, ".pre_relu") : out_name(result_value, result_layer);
        std::vector<std::string> inputs = {x, name + ".weight"};
        g.Initializer(name + ".weight", {K, kernel.value.shape()[3], cfg.kernel_h, cfg.kernel_w},
                      w);
        if (has_bias) {
          g.Initializer(name + ".bias", {K}, b);
          inputs.push_back(name + ".bias");
        }
        onnx::NodeProto* n = g.Node("Conv", name, inputs, y);
        GraphWriter::Ints(n, "kernel_shape", {cfg.kernel_h, cfg.kernel_w});
        GraphWriter::Ints(n, "strides", {cfg.stride, cfg.stride});
        GraphWriter::Ints(n, "pads", {cfg.pad, cfg.pad, cfg.pad, cfg.pad});
        GraphWriter::Ints(n, "dilations", {1, 1});
        GraphWriter::Int(n, "group", 1);
        names[result_value] = relu ? relu_after(result_layer, result_value) : y;
        break;
      }
      case LayerKind::kBatchNorm: {
        auto* norm = static_cast<BatchNorm2d*>(layer);
        std::vector<std::string> inputs = {x};
        for (ParamRole role : {ParamRole::kGamma, ParamRole::kBeta, ParamRole::kRunningMean,
                               ParamRole::kRunningVar}) {
          const Parameter& p = *Param(norm, role);
          const std::string t = absl::StrCat(name, ".", ParamRoleName(role));
          g.Initializer(t, {static_cast<int64_t>(p.size())}, Values(p));
          inputs.push_back(t);
        }
        const bool relu = norm->fused_relu();
        const std::string y = relu ? name + ".pre_relu" : out_name(out, name);
        onnx::NodeProto* n = g.Node("BatchNormalization", name, inputs, y);
        GraphWriter::Float(n, "epsilon", kernels::BatchNormShape{}.eps);
        GraphWriter::Float(n, "momentum", 0.9f);  // ONNX's momentum weighs the old statistic
        names[out] = relu ? relu_after(name, out) : y;
        break;
      }
      case LayerKind::kRelu:
        flat[out] = flat[nodes[j].inputs[0]];
        names[out] = out_name(out, name);
        g.Node("Relu", name, {x}, names[out]);
        break;
      case LayerKind::kAdd: {
        auto* add = static_cast<Add*>(layer);
        const std::string y = add->fused_relu() ? name + ".pre_relu" : out_name(out, name);
        g.Node("Add", name, {x, names[nodes[j].inputs[1]]}, y);
        names[out] = add->fused_relu() ? relu_after(name, out) : y;
        break;
      }
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool: {
        auto* pool = static_cast<Pool2d*>(layer);
        const bool max = layer->kind() == LayerKind::kMaxPool;
        names[out] = out_name(out, name);
        onnx::NodeProto* n = g.Node(max ? "MaxPool" : "AveragePool", name, {x}, names[out]);
        GraphWriter::Ints(n, "kernel_shape", {pool->window(), pool->window()});
        GraphWriter::Ints(n, "strides", {pool->stride(), pool->stride()});
        GraphWriter::Ints(n, "pads", {pool->pad(), pool->pad(), pool->pad(), pool->pad()});
        if (!max) GraphWriter::Int(n, "count_include_pad", 1);  // Topiary counts padding
        break;
      }
      case LayerKind::kGlobalAvgPool:
        names[out] = out_name(out, name);
        g.Node("GlobalAveragePool", name, {x}, names[out]);
        break;
      case LayerKind::kFlatten: {
        names[out] = out_name(out, name);
        onnx::NodeProto* n = g.Node("Flatten", name, {x}, names[out]);
        GraphWriter::Int(n, "axis", 1);
        flat[out] = true;
        break;
      }
      case LayerKind::kLinear: {
        auto* fc = static_cast<Linear*>(layer);
        const Parameter& kernel = *Param(fc, ParamRole::kKernel);
        CountZeros(kernel, &summary);
        const int rows = kernel.value.shape()[0], cols = kernel.value.shape()[1];
        std::vector<float> w = Values(kernel);
        const int src = nodes[j].inputs[0];
        std::string xin = x;
        const int p = producer[src];
        if (p >= 0 && nodes[p].layer->kind() == LayerKind::kFlatten) {
          // Topiary flattens NHWC (h, w, c); ONNX's Flatten of NCHW gives (c, h, w): the
          // columns are reordered to match.
          const Shape4 f = model.value_shapes()[nodes[p].inputs[0]];
          if (f.h * f.w > 1) {
            const std::vector<float> hwc = w;
            for (int r = 0; r < rows; ++r)
              for (int y = 0; y < f.h; ++y)
                for (int q = 0; q < f.w; ++q)
                  for (int c = 0; c < f.c; ++c)
                    w[static_cast<size_t>(r) * cols + (c * f.h + y) * f.w + q] =
                        hwc[static_cast<size_t>(r) * cols + (y * f.w + q) * f.c + c];
          }
        } else if (!flat[src]) {
          // A [N, C, 1, 1] input (after global pooling): Gemm wants [N, C].
          xin = name + ".flat";
          onnx::NodeProto* n = g.Node("Flatten", name + ".flatten", {x}, xin);
          GraphWriter::Int(n, "axis", 1);
        }
        g.Initializer(name + ".weight", {rows, cols}, w);
        g.Initializer(name + ".bias", {rows}, Values(*Param(fc, ParamRole::kBias)));
        names[out] = out_name(out, name);
        onnx::NodeProto* n =
            g.Node("Gemm", name, {xin, name + ".weight", name + ".bias"}, names[out]);
        GraphWriter::Int(n, "transB", 1);
        flat[out] = true;
        break;
      }
    }
    done[j] = true;
  }
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
  auto doc = ReadCheckpointFile(checkpoint);
  if (!doc.ok()) return doc.status();
  const CheckpointState state = CheckpointStateOf(*doc);
  auto parsed = ParseSpec(state.spec_text, checkpoint + " (its spec)");
  if (!parsed.ok()) return parsed.status();
  const topiary::v1::ExperimentSpec spec = WithDefaults(*parsed);

  topiary::v1::InputFormat input;
  if (!state.input_json.empty()) {
    if (!google::protobuf::util::JsonStringToMessage(state.input_json, &input).ok()) {
      return absl::DataLossError(absl::StrCat(checkpoint, ": /@input: not an InputFormat"));
    }
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
  auto device = CreateDevice(cpu);
  if (!device.ok()) return device.status();
  auto model = BuildModel(state.model_arch, spec.model().width(),
                          Shape4{1, input.height(), input.width(), input.channels()},
                          input.classes(), device->get());
  if (!model.ok()) return model.status();
  auto loaded = LoadCheckpoint(checkpoint, model->get(), /*with_optimizer=*/false);
  if (!loaded.ok()) return loaded.status();

  std::vector<std::string> approximate;
  for (const auto& [group, attrs] : doc->groups) {
    if (attrs.count("multiplier") && group.rfind("/layers/", 0) == 0) {
      approximate.push_back(group.substr(8));
    }
  }
  std::string input_json;
  google::protobuf::util::JsonPrintOptions json;
  json.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(input, &input_json, json);
  const std::vector<std::pair<std::string, std::string>> metadata = {
      {"topiary.model_arch", state.model_arch},
      {"topiary.experiment", state.experiment_id},
      {"topiary.round", std::to_string(state.round)},
      {"topiary.epoch", std::to_string(state.epoch)},
      {"topiary.metrics", state.metrics_json},
      {"topiary.input", input_json},
      {"topiary.batch_norm", options.fold_batch_norm ? "folded" : "kept"},
      {"topiary.approximate_layers_exported_exact", absl::StrJoin(approximate, ",")},
  };
  auto summary = ExportOnnx(**model, input, options, metadata, path);
  if (!summary.ok()) return summary.status();
  summary->approximate_layers = approximate;
  return summary;
}

}  // namespace topiary
