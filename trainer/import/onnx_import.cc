#include "trainer/import/onnx_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "onnx/onnx.pb.h"
#include "trainer/nn/graph.h"
#include "trainer/nn/layers.h"
#include "trainer/spec/spec.h"
#include "trainer/store/checkpoint.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::LayerNode;
using topiary::v1::NetworkGraph;

constexpr int64_t kMaxTensorElements = int64_t{1} << 28;
constexpr uint64_t kMaxFileBytes = uint64_t{2} << 30;
constexpr int kMaxNodes = 20000;

// A constant (initializer or Constant node): dims and values as doubles (FLOAT, DOUBLE, INT32
// and INT64 are read; weights are FLOAT).
struct Const {
  std::vector<int64_t> dims;
  std::vector<double> v;
  int64_t count() const { return static_cast<int64_t>(v.size()); }
};

std::string DimsText(const std::vector<int64_t>& d) { return "[" + absl::StrJoin(d, ", ") + "]"; }

// The n values of a tensor of element type T: from raw_data (little-endian, as ONNX stores it)
// or from the typed field; false when the file holds another number of them.
template <typename T, typename Field>
bool LoadValues(const onnx::TensorProto& t, const Field& typed, int64_t n,
                std::vector<double>* out) {
  if (!t.has_raw_data()) {
    if (typed.size() != n) return false;
    out->assign(typed.begin(), typed.end());
    return true;
  }
  const std::string& raw = t.raw_data();
  if (raw.size() != static_cast<size_t>(n) * sizeof(T)) return false;
  out->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, raw.data() + i * sizeof(T), sizeof(T));
    (*out)[i] = static_cast<double>(x);
  }
  return true;
}

absl::StatusOr<Const> ReadTensor(const onnx::TensorProto& t, const std::string& what) {
  if (t.data_location() == onnx::TensorProto::EXTERNAL || t.external_data_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": its data is in an external file; export the model with the weights inside "
                     "(torch.onnx.export does for models under 2 GB)"));
  }
  Const c;
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > kMaxTensorElements || (n *= std::max<int64_t>(d, 1)) > kMaxTensorElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dims ", DimsText({t.dims().begin(), t.dims().end()}),
                       " are negative or over ", kMaxTensorElements, " elements"));
    }
    c.dims.push_back(d);
  }
  for (int64_t d : c.dims) n = d == 0 ? 0 : n;
  bool ok = false;
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      ok = LoadValues<float>(t, t.float_data(), n, &c.v);
      break;
    case onnx::TensorProto::DOUBLE:
      ok = LoadValues<double>(t, t.double_data(), n, &c.v);
      break;
    case onnx::TensorProto::INT64:
      ok = LoadValues<int64_t>(t, t.int64_data(), n, &c.v);
      break;
    case onnx::TensorProto::INT32:
      ok = LoadValues<int32_t>(t, t.int32_data(), n, &c.v);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: element type %d is not read (FLOAT, DOUBLE, INT32 and INT64 are)",
                          what, t.data_type()));
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": holds a different number of values than its dims ", DimsText(c.dims),
                     " say (truncated?)"));
  }
  for (double x : c.v) {
    if (!std::isfinite(x)) return absl::InvalidArgumentError(what + ": holds NaN or infinity");
  }
  return c;
}

// Layer names: ONNX names ("/layer1/layer1.0/conv1/Conv") in the graph's alphabet.
std::string CleanName(const std::string& raw) {
  std::string out;
  for (char ch : raw) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-' || ch == ':';
    out += ok ? ch : '.';
  }
  while (!out.empty() && out[0] == '.') out.erase(0, 1);
  return out.substr(0, 150);
}

// PyTorch's scoped node names ("/layer1/layer1.0/relu/Relu"): the module scopes, outermost
// first, and the operator; empty for other names.
std::vector<std::string> ScopesOf(const std::string& name) {
  if (name.size() < 2 || name[0] != '/') return {};
  std::vector<std::string> parts = absl::StrSplit(name.substr(1), '/');
  parts.pop_back();  // the operator
  return parts;
}

// A module path from its scopes: each scope is the child's attribute name, or (inside a
// Sequential) already the full path ("stem", "stem.2"): ["layer1", "layer1.0", "relu"] is
// "layer1.0.relu".
std::string ModulePath(const std::vector<std::string>& scopes) {
  std::string path;
  for (const std::string& s : scopes) {
    path = path.empty() || absl::StartsWith(s, path + ".") ? s : absl::StrCat(path, ".", s);
  }
  return path;
}

struct Param {
  std::string layer;
  ParamRole role;
  Const value;
  bool transpose = false;  // MatMul's [in, out] weight, or Gemm's without transB
};

class Reader {
 public:
  Reader(const onnx::ModelProto& m, const std::string& name, const OnnxImportOptions& options)
      : m_(m), g_(m.graph()), name_(name), options_(options) {}

  absl::Status Read() {
    TOPIARY_RETURN_IF_ERROR(CheckOpset());
    if (g_.node_size() > kMaxNodes) {
      return Error(absl::StrFormat("%d nodes (at most %d)", g_.node_size(), kMaxNodes));
    }
    for (const onnx::TensorProto& t : g_.initializer()) {
      TOPIARY_ASSIGN_OR_RETURN(
          Const c, ReadTensor(t, absl::StrCat(name_, ": initializer '", t.name(), "'")));
      consts_[t.name()] = std::make_shared<const Const>(std::move(c));
    }
    TOPIARY_RETURN_IF_ERROR(ReadInput());
    for (const onnx::NodeProto& n : g_.node()) {
      const std::vector<std::string> scopes = ScopesOf(n.name());
      for (size_t k = 1; k < scopes.size(); ++k) {
        inner_modules_.insert(ModulePath({scopes.begin(), scopes.begin() + k}));
      }
    }
    for (const onnx::NodeProto& n : g_.node()) {
      for (const std::string& in : n.input()) ++consumers_[in];
    }
    for (const onnx::ValueInfoProto& out : g_.output()) ++consumers_[out.name()];
    for (int i = 0; i < g_.node_size(); ++i) TOPIARY_RETURN_IF_ERROR(Node(g_.node(i), i));
    return ReadOutput();
  }

  NetworkGraph& graph() { return graph_; }
  const std::vector<Param>& params() const { return params_; }
  // The parameter values the file gives (and the zero biases it implies): the most a model
  // built from it may hold.
  int64_t parameter_values() const {
    int64_t n = parameter_values_;
    for (const Param& p : params_) n += p.value.count();
    return n;
  }
  topiary::v1::ImportSummary& summary() { return summary_; }

 private:
  struct Value {
    std::string layer;  // "input" or a layer of graph_
    int node = -1;      // that layer's index in graph_ (-1: the input)
  };

  absl::Status Error(const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", why));
  }
  absl::Status NodeError(const onnx::NodeProto& n, const std::string& why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": node '", n.name(), "' (", n.op_type(), "): ", why));
  }

  absl::Status CheckOpset() {
    for (const auto& o : m_.opset_import()) {
      if (o.domain().empty() || o.domain() == "ai.onnx") {
        opset_ = o.version();
      }
    }
    if (opset_ < 7 || opset_ > 23) {
      return Error(absl::StrFormat(
          "default-domain opset %d is not read (7 to 23 are; not an ONNX model?)", opset_));
    }
    return absl::OkStatus();
  }

  absl::Status ReadInput() {
    const onnx::ValueInfoProto* input = nullptr;
    for (const auto& in : g_.input()) {
      if (consts_.count(in.name())) continue;  // older exporters list initializers as inputs
      if (input != nullptr) {
        return Error("more than one graph input; the importer reads networks of one image input");
      }
      input = &in;
    }
    if (input == nullptr) return Error("no graph input (the image)");
    const auto& type = input->type().tensor_type();
    if (type.elem_type() != onnx::TensorProto::FLOAT || type.shape().dim_size() != 4) {
      return Error(absl::StrCat("input '", input->name(),
                                "' is not a 4-D float tensor [N, C, H, W] (an image batch)"));
    }
    int dims[3];
    const int wanted[3] = {options_.channels, options_.height, options_.width};
    const char* names[3] = {"channels", "height", "width"};
    for (int i = 0; i < 3; ++i) {
      const auto& d = type.shape().dim(i + 1);
      const int64_t v = d.has_dim_value() ? d.dim_value() : 0;
      if (v > 0 && wanted[i] > 0 && v != wanted[i]) {
        return Error(
            absl::StrFormat("the input's %s is %d, not %d as asked", names[i], v, wanted[i]));
      }
      dims[i] = static_cast<int>(v > 0 && v <= 4096 ? v : wanted[i]);
      if (dims[i] <= 0) {
        return Error(absl::StrFormat(
            "the input's %s is symbolic or out of range; give it (--input HxWxC)", names[i]));
      }
    }
    graph_.set_channels(dims[0]);
    graph_.set_height(dims[1]);
    graph_.set_width(dims[2]);
    values_[input->name()] = {kGraphInput, -1};
    return absl::OkStatus();
  }

  absl::StatusOr<Value> In(const onnx::NodeProto& n, int i) const {
    if (i >= n.input_size() || n.input(i).empty()) {
      return NodeError(n, absl::StrFormat("input %d is missing", i));
    }
    auto v = values_.find(n.input(i));
    if (v == values_.end()) {
      return NodeError(n, absl::StrCat("reads '", n.input(i),
                                       "', which no earlier node makes (a cycle, or nodes out "
                                       "of order), or a constant where a tensor is expected"));
    }
    return v->second;
  }

  absl::StatusOr<const Const*> ConstIn(const onnx::NodeProto& n, int i) const {
    if (i >= n.input_size() || !consts_.count(n.input(i))) {
      return NodeError(n, absl::StrFormat("input %d must be a constant (an initializer)", i));
    }
    return consts_.at(n.input(i)).get();
  }

  static const onnx::AttributeProto* Attr(const onnx::NodeProto& n, const std::string& name) {
    for (const auto& a : n.attribute()) {
      if (a.name() == name) return &a;
    }
    return nullptr;
  }
  static int64_t IntAttr(const onnx::NodeProto& n, const std::string& name, int64_t dflt) {
    const auto* a = Attr(n, name);
    return a ? a->i() : dflt;
  }
  static std::vector<int64_t> IntsAttr(const onnx::NodeProto& n, const std::string& name) {
    const auto* a = Attr(n, name);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
  }

  // A weight's dims set its layer's width: one of 0 would make a layer of any width from no
  // values at all.
  absl::Status NoZeroDims(const onnx::NodeProto& n, const Const& w) const {
    for (int64_t d : w.dims) {
      if (d == 0) return NodeError(n, "weight dims " + DimsText(w.dims) + " include a zero");
    }
    return absl::OkStatus();
  }

  // kernel_shape / strides / pads / dilations of Conv and the poolings, as Topiary's square
  // stride and symmetric pad; anything else is refused by name.
  struct Window {
    int kh = 1, kw = 1, stride = 1, pad = 0;
  };
  absl::StatusOr<Window> ReadWindow(const onnx::NodeProto& n, const Const* weight) const {
    const auto* auto_pad = Attr(n, "auto_pad");
    if (auto_pad && auto_pad->s() != "NOTSET" && !auto_pad->s().empty()) {
      return NodeError(n, "auto_pad " + auto_pad->s() + " is not read (explicit pads are)");
    }
    std::vector<int64_t> k = IntsAttr(n, "kernel_shape");
    if (k.empty() && weight && weight->dims.size() == 4) k = {weight->dims[2], weight->dims[3]};
    std::vector<int64_t> s = IntsAttr(n, "strides"), p = IntsAttr(n, "pads"),
                         d = IntsAttr(n, "dilations");
    if (s.empty()) s = {1, 1};
    if (p.empty()) p = {0, 0, 0, 0};
    if (d.empty()) d = {1, 1};
    if (k.size() != 2 || s.size() != 2 || p.size() != 4 || d.size() != 2) {
      return NodeError(n, "only 2-D windows are read");
    }
    if (d[0] != 1 || d[1] != 1) return NodeError(n, "dilations other than 1 are not read");
    if (s[0] != s[1]) return NodeError(n, "strides differ between height and width");
    if (p[0] != p[1] || p[0] != p[2] || p[0] != p[3]) {
      return NodeError(n, "pads differ between sides (Topiary pads every side alike)");
    }
    for (int64_t v : {k[0], k[1], s[0]}) {
      if (v < 1 || v > 31) return NodeError(n, "a window or stride outside 1-31");
    }
    if (p[0] < 0 || p[0] > 31) return NodeError(n, "pads outside 0-31");
    return Window{static_cast<int>(k[0]), static_cast<int>(k[1]), static_cast<int>(s[0]),
                  static_cast<int>(p[0])};
  }

  // The name a layer takes: the module's where PyTorch's export shows it, so that a model
  // imported from a module names its layers as the module does ("stem.0", "layer1.0.conv1"):
  // the prefix of a weight initializer "<module>.weight" (Conv, Gemm, BatchNormalization, as
  // exported without folding); else a leaf module's path from a scoped node name
  // ("/stem/stem.2/Sigmoid" -> "stem.2"), or for an operator in an outer module's own
  // forward, that path and the operator ("/se1/Mul" -> "se1.Mul"); else the node's name or
  // its output's.
  std::string LayerName(const onnx::NodeProto& n) const {
    if (n.input_size() > 1 && n.input(1).size() > 7 && absl::EndsWith(n.input(1), ".weight") &&
        consts_.count(n.input(1))) {
      return n.input(1).substr(0, n.input(1).size() - 7);
    }
    const std::vector<std::string> scopes = ScopesOf(n.name());
    if (!scopes.empty()) {
      const std::string path = ModulePath(scopes);
      return inner_modules_.count(path) ? absl::StrCat(path, ".", n.op_type()) : path;
    }
    return n.name().empty() ? n.output(0) : n.name();
  }

  // Adds a layer reading `inputs` and makes it the value of the node's first output.
  LayerNode* Emit(const onnx::NodeProto& n, int index, topiary::v1::NodeKind kind,
                  const std::vector<Value>& inputs) {
    std::string base = CleanName(LayerName(n));
    if (base.empty()) base = absl::StrCat(topiary::v1::NodeKind_Name(kind), index);
    std::string name = base;
    for (int k = 1; used_.count(name) || name == kGraphInput; ++k)
      name = absl::StrCat(base, "_", k);
    used_.insert(name);
    LayerNode* layer = graph_.add_layers();
    layer->set_name(name);
    layer->set_kind(kind);
    for (const Value& v : inputs) layer->add_inputs(v.layer);
    values_[n.output(0)] = {name, graph_.layers_size() - 1};
    uses_[graph_.layers_size() - 1] += Consumers(n.output(0));
    return layer;
  }

  // The nodes (and graph outputs) that read the tensor `name`.
  int64_t Consumers(const std::string& name) const {
    auto c = consumers_.find(name);
    return c == consumers_.end() ? 0 : c->second;
  }

  // Makes `n`'s first output another name of `v`, which `n` read: the readers of the new name
  // read v's layer too, and `n` itself is no reader of it.
  void Rename(const onnx::NodeProto& n, const Value& v) {
    values_[n.output(0)] = v;
    if (v.node >= 0) uses_[v.node] += Consumers(n.output(0)) - 1;
  }

  void Alias(const onnx::NodeProto& n, const Value& v) {
    Rename(n, v);
    summary_.set_dropped(summary_.dropped() + 1);
  }

  absl::Status Node(const onnx::NodeProto& n, int index) {
    if (!n.domain().empty() && n.domain() != "ai.onnx") {
      return NodeError(n, "operators of domain '" + n.domain() + "' are not read");
    }
    if (n.output_size() < 1 || n.output(0).empty()) return NodeError(n, "has no output");
    const std::string& op = n.op_type();
    if (op == "Constant") {
      const auto* a = Attr(n, "value");
      if (a == nullptr || !a->has_t()) return NodeError(n, "only tensor constants are read");
      TOPIARY_ASSIGN_OR_RETURN(Const c,
                               ReadTensor(a->t(), absl::StrCat(name_, ": node '", n.name(), "'")));
      consts_[n.output(0)] = std::make_shared<const Const>(std::move(c));
      summary_.set_dropped(summary_.dropped() + 1);
      return absl::OkStatus();
    }
    if (op == "Identity" && n.input_size() == 1 && consts_.count(n.input(0))) {
      // PyTorch's exporter shares equal initializers (e.g. fresh batch norms' ones and zeros)
      // through Identity nodes: the same constant under another name, not a copy.
      consts_[n.output(0)] = consts_.at(n.input(0));
      summary_.set_dropped(summary_.dropped() + 1);
      return absl::OkStatus();
    }
    if (op == "Identity" || op == "Dropout") {
      TOPIARY_ASSIGN_OR_RETURN(Value v, In(n, 0));
      Alias(n, v);
      return absl::OkStatus();
    }
    if (op == "Pad") return Pad(n);
    if (op == "Conv") return Conv(n, index);
    if (op == "BatchNormalization") return BatchNorm(n, index);
    if (op == "Relu") return Relu(n, index, false);
    if (op == "Clip") return Clip(n, index);
    if (op == "Add") return AddNode(n, index);
    if (op == "Mul") return MulNode(n, index);
    if (op == "Sigmoid" || op == "HardSwish") {
      TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
      Emit(n, index, op == "Sigmoid" ? topiary::v1::sigmoid : topiary::v1::hard_swish, {x});
      return absl::OkStatus();
    }
    if (op == "LeakyRelu" || op == "HardSigmoid") {
      TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
      const bool leaky = op == "LeakyRelu";
      const auto* alpha = Attr(n, "alpha");
      const auto* beta = Attr(n, "beta");
      // ONNX's defaults; the graph builder checks the values (naming the layer).
      const float a = alpha ? alpha->f() : leaky ? 0.01f : 0.2f;
      const float b = beta ? beta->f() : 0.5f;
      LayerNode* l =
          Emit(n, index, leaky ? topiary::v1::leaky_relu : topiary::v1::hard_sigmoid, {x});
      l->set_alpha(a);
      if (!leaky) l->set_beta(b);
      return absl::OkStatus();
    }
    if (op == "MaxPool" || op == "AveragePool") return Pool(n, index);
    if (op == "GlobalAveragePool") {
      TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
      Emit(n, index, topiary::v1::global_avg_pool, {x});
      return absl::OkStatus();
    }
    if (op == "ReduceMean") return ReduceMean(n, index);
    if (op == "Flatten" || op == "Reshape") return Flatten(n, index);
    if (op == "Gemm" || op == "MatMul") return Gemm(n, index);
    if (op == "Concat") {
      const int64_t axis = IntAttr(n, "axis", 1);
      if (axis != 1) return NodeError(n, "concatenation along an axis other than channels (1)");
      std::vector<Value> ins;
      for (int i = 0; i < n.input_size(); ++i) {
        TOPIARY_ASSIGN_OR_RETURN(Value v, In(n, i));
        ins.push_back(v);
      }
      Emit(n, index, topiary::v1::concat, ins);
      return absl::OkStatus();
    }
    return NodeError(n,
                     "operator not supported; the importer reads Conv, BatchNormalization, "
                     "Relu, Clip (ReLU6), Add, Mul (of two tensors), Sigmoid, HardSigmoid, "
                     "HardSwish, LeakyRelu, MaxPool, AveragePool, GlobalAveragePool, ReduceMean "
                     "(over H, W), "
                     "Flatten, Reshape (to 2-D), Gemm, MatMul, Concat, Constant, Identity, "
                     "Dropout, Pad (of nothing)");
  }

  // Zero padding of nothing (PyTorch's export of some poolings) is dropped; real padding is
  // refused (the convolutions and poolings that follow pad themselves).
  absl::Status Pad(const onnx::NodeProto& n) {
    TOPIARY_ASSIGN_OR_RETURN(Value v, In(n, 0));
    std::vector<double> pads;
    if (opset_ < 11) {
      for (int64_t p : IntsAttr(n, "pads")) pads.push_back(static_cast<double>(p));
    } else {
      TOPIARY_ASSIGN_OR_RETURN(const Const* c, ConstIn(n, 1));
      pads = c->v;
    }
    for (double p : pads) {
      if (p != 0) return NodeError(n, "padding other than none is not read");
    }
    Alias(n, v);
    return absl::OkStatus();
  }

  absl::Status Conv(const onnx::NodeProto& n, int index) {
    TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
    TOPIARY_ASSIGN_OR_RETURN(const Const* w, ConstIn(n, 1));
    if (w->dims.size() != 4) return NodeError(n, "weight is not 4-D [K, C/groups, kH, kW]");
    TOPIARY_RETURN_IF_ERROR(NoZeroDims(n, *w));
    TOPIARY_ASSIGN_OR_RETURN(Window win, ReadWindow(n, w));
    if (w->dims[2] != win.kh || w->dims[3] != win.kw) {
      return NodeError(n, "kernel_shape differs from the weight's");
    }
    const int64_t groups = IntAttr(n, "group", 1);
    if (groups < 1 || groups > 65536) return NodeError(n, "group outside 1-65536");
    const bool bias = n.input_size() > 2 && !n.input(2).empty();
    LayerNode* l =
        Emit(n, index, groups == 1 ? topiary::v1::conv2d : topiary::v1::grouped_conv2d, {x});
    l->set_out_channels(static_cast<int>(std::min<int64_t>(w->dims[0], 1 << 20)));
    l->set_kernel_h(win.kh);
    l->set_kernel_w(win.kw);
    l->set_stride(win.stride);
    l->set_pad(win.pad);
    l->set_bias(bias);
    if (groups > 1) l->set_groups(static_cast<int>(groups));
    params_.push_back({l->name(), ParamRole::kKernel, *w});
    if (bias) {
      TOPIARY_ASSIGN_OR_RETURN(const Const* b, ConstIn(n, 2));
      params_.push_back({l->name(), ParamRole::kBias, *b});
    }
    return absl::OkStatus();
  }

  absl::Status BatchNorm(const onnx::NodeProto& n, int index) {
    TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
    if (IntAttr(n, "training_mode", 0) != 0) return NodeError(n, "training_mode = 1");
    for (int i = 1; i < n.output_size(); ++i) {
      if (consumers_.count(n.output(i))) {
        return NodeError(n, "its running-statistics outputs are read (a training graph)");
      }
    }
    const auto* eps = Attr(n, "epsilon");
    LayerNode* l = Emit(n, index, topiary::v1::batch_norm, {x});
    l->set_epsilon(eps ? eps->f() : 1e-5f);
    const ParamRole roles[4] = {ParamRole::kGamma, ParamRole::kBeta, ParamRole::kRunningMean,
                                ParamRole::kRunningVar};
    for (int i = 0; i < 4; ++i) {
      TOPIARY_ASSIGN_OR_RETURN(const Const* c, ConstIn(n, i + 1));
      params_.push_back({l->name(), roles[i], *c});
    }
    summary_.set_batch_norms(summary_.batch_norms() + 1);
    return absl::OkStatus();
  }

  // A ReLU (or ReLU6) layer, or, for a ReLU whose input only it reads and which a batch norm
  // or add makes, that layer's fused ReLU.
  absl::Status Relu(const onnx::NodeProto& n, int index, bool six) {
    TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
    // Counted over every name of x's layer (Identity and Dropout give it more): only when
    // this ReLU is its one reader does the fusion leave every other reader the same values.
    if (!six && x.node >= 0 && uses_[x.node] == 1) {
      LayerNode* p = graph_.mutable_layers(x.node);
      if ((p->kind() == topiary::v1::batch_norm || p->kind() == topiary::v1::add) && !p->relu()) {
        p->set_relu(true);
        Rename(n, x);
        summary_.set_fused_relus(summary_.fused_relus() + 1);
        return absl::OkStatus();
      }
    }
    Emit(n, index, six ? topiary::v1::relu6 : topiary::v1::relu, {x});
    return absl::OkStatus();
  }

  // Clip(0, 6) is ReLU6 and Clip(0, +inf) ReLU; other bounds are refused.
  absl::Status Clip(const onnx::NodeProto& n, int index) {
    double lo = -std::numeric_limits<double>::infinity(), hi = -lo;
    if (opset_ < 11) {
      if (const auto* a = Attr(n, "min")) lo = a->f();
      if (const auto* a = Attr(n, "max")) hi = a->f();
    } else {
      for (int i = 1; i <= 2; ++i) {
        if (i >= n.input_size() || n.input(i).empty()) continue;
        TOPIARY_ASSIGN_OR_RETURN(const Const* c, ConstIn(n, i));
        if (c->count() != 1) return NodeError(n, "a bound is not a scalar");
        (i == 1 ? lo : hi) = c->v[0];
      }
    }
    if (lo != 0 || !(hi == 6 || std::isinf(hi))) {
      return NodeError(n, absl::StrFormat("Clip(%g, %g) is not read (Clip(0, 6) as ReLU6 and "
                                          "Clip(0, inf) as ReLU are)",
                                          lo, hi));
    }
    return Relu(n, index, hi == 6);
  }

  absl::Status AddNode(const onnx::NodeProto& n, int index) {
    if (n.input_size() == 2 && consts_.count(n.input(1)) && pending_bias_.count(n.input(0))) {
      // MatMul + Add: the bias of the linear layer before it.
      const Value v = values_.at(n.input(0));
      TOPIARY_ASSIGN_OR_RETURN(const Const* b, ConstIn(n, 1));
      params_.push_back({v.layer, ParamRole::kBias, *b});
      pending_bias_.erase(n.input(0));
      Rename(n, v);
      return absl::OkStatus();
    }
    TOPIARY_ASSIGN_OR_RETURN(Value a, In(n, 0));
    TOPIARY_ASSIGN_OR_RETURN(Value b, In(n, 1));
    Emit(n, index, topiary::v1::add, {a, b});
    return absl::OkStatus();
  }

  // x * gate(x), where only this Mul reads the gate, is one layer: SiLU (Sigmoid, PyTorch's
  // export of nn.SiLU) or hard swish (HardSigmoid 1/6, 1/2, its export of nn.Hardswish before
  // opset 14). Any other product of two tensors is a mul layer: of one shape, or a map and a
  // per-channel scale (squeeze-and-excitation). A constant factor is refused.
  absl::Status MulNode(const onnx::NodeProto& n, int index) {
    if (n.input_size() != 2) return NodeError(n, "a Mul reads two inputs");
    for (int i = 0; i < 2; ++i) {
      if (consts_.count(n.input(i))) {
        return NodeError(n,
                         "a product with a constant is not read (products of two layers' "
                         "outputs are: gates and squeeze-and-excitation scales)");
      }
    }
    TOPIARY_ASSIGN_OR_RETURN(Value a, In(n, 0));
    TOPIARY_ASSIGN_OR_RETURN(Value b, In(n, 1));
    for (const auto& [x, gate] : {std::pair{a, b}, std::pair{b, a}}) {
      if (gate.node < 0 || uses_[gate.node] != 1) continue;
      LayerNode* g = graph_.mutable_layers(gate.node);
      if (g->inputs_size() != 1 || g->inputs(0) != x.layer) continue;
      const bool hard = g->kind() == topiary::v1::hard_sigmoid &&
                        std::abs(g->alpha() - 1.0 / 6) < 1e-6 && std::abs(g->beta() - 0.5) < 1e-6;
      if (g->kind() != topiary::v1::sigmoid && !hard) continue;
      g->set_kind(hard ? topiary::v1::hard_swish : topiary::v1::silu);
      g->set_alpha(0);
      g->set_beta(0);
      Rename(n, gate);
      return absl::OkStatus();
    }
    Emit(n, index, topiary::v1::mul, {a, b});
    return absl::OkStatus();
  }

  absl::Status Pool(const onnx::NodeProto& n, int index) {
    TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
    TOPIARY_ASSIGN_OR_RETURN(Window win, ReadWindow(n, nullptr));
    const bool max = n.op_type() == "MaxPool";
    if (win.kh != win.kw) return NodeError(n, "a non-square window");
    if (IntAttr(n, "ceil_mode", 0) != 0) return NodeError(n, "ceil_mode = 1 is not read");
    if (max && (n.output_size() > 1 && consumers_.count(n.output(1)))) {
      return NodeError(n, "its indices output is read");
    }
    if (!max && win.pad > 0 && IntAttr(n, "count_include_pad", 0) == 0) {
      return NodeError(n,
                       "padding left out of the average (count_include_pad = 0) is not "
                       "read; Topiary's average pooling counts padding as zeros");
    }
    LayerNode* l = Emit(n, index, max ? topiary::v1::max_pool : topiary::v1::avg_pool, {x});
    l->set_window(win.kh);
    l->set_stride(win.stride);
    l->set_pad(win.pad);
    return absl::OkStatus();
  }

  // The mean over height and width (x.mean((2, 3)) in PyTorch): global average pooling, and
  // a flatten after it without keepdims.
  absl::Status ReduceMean(const onnx::NodeProto& n, int index) {
    TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
    std::vector<int64_t> axes = IntsAttr(n, "axes");
    if (opset_ >= 18 && n.input_size() > 1 && !n.input(1).empty()) {
      TOPIARY_ASSIGN_OR_RETURN(const Const* c, ConstIn(n, 1));
      axes.assign(c->v.begin(), c->v.end());
    }
    for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
    std::sort(axes.begin(), axes.end());
    if (axes != std::vector<int64_t>{2, 3}) {
      return NodeError(n, "a mean over axes other than height and width (2, 3) is not read");
    }
    Emit(n, index, topiary::v1::global_avg_pool, {x});
    if (IntAttr(n, "keepdims", 1) == 0) {
      const Value pooled = values_.at(n.output(0));
      Emit(n, index, topiary::v1::flatten, {pooled});
    }
    return absl::OkStatus();
  }

  absl::Status Flatten(const onnx::NodeProto& n, int index) {
    TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
    if (n.op_type() == "Flatten" && IntAttr(n, "axis", 1) != 1) {
      return NodeError(n, "flattening at an axis other than 1 (keep the batch, flatten the rest)");
    }
    if (n.op_type() == "Reshape") {
      TOPIARY_ASSIGN_OR_RETURN(const Const* shape, ConstIn(n, 1));
      if (shape->count() != 2 || shape->v[1] == 0 || shape->v[1] < -1) {
        return NodeError(n, "only a reshape to 2-D [batch, features] is read");
      }
    }
    Emit(n, index, topiary::v1::flatten, {x});
    return absl::OkStatus();
  }

  absl::Status Gemm(const onnx::NodeProto& n, int index) {
    TOPIARY_ASSIGN_OR_RETURN(Value x, In(n, 0));
    TOPIARY_ASSIGN_OR_RETURN(const Const* w, ConstIn(n, 1));
    if (w->dims.size() != 2) return NodeError(n, "weight is not 2-D");
    TOPIARY_RETURN_IF_ERROR(NoZeroDims(n, *w));
    const bool gemm = n.op_type() == "Gemm";
    if (gemm) {
      const auto* alpha = Attr(n, "alpha");
      const auto* beta = Attr(n, "beta");
      if ((alpha && alpha->f() != 1) || (beta && beta->f() != 1) || IntAttr(n, "transA", 0)) {
        return NodeError(n, "alpha, beta other than 1 or transA are not read");
      }
    }
    const bool trans_b = gemm && IntAttr(n, "transB", 0) == 1;
    const int64_t out = trans_b ? w->dims[0] : w->dims[1];
    LayerNode* l = Emit(n, index, topiary::v1::linear, {x});
    l->set_out_channels(static_cast<int>(std::min<int64_t>(out, 1 << 20)));
    params_.push_back({l->name(), ParamRole::kKernel, *w, !trans_b});
    if (gemm && n.input_size() > 2 && !n.input(2).empty()) {
      TOPIARY_ASSIGN_OR_RETURN(const Const* b, ConstIn(n, 2));
      if (b->count() != out) return NodeError(n, "bias C is not a vector of the outputs");
      params_.push_back({l->name(), ParamRole::kBias, *b});
    } else {
      pending_bias_.insert(n.output(0));  // a following Add may give it; else zero
      parameter_values_ += out;
    }
    return absl::OkStatus();
  }

  absl::Status ReadOutput() {
    if (g_.output_size() != 1) {
      return Error(
          absl::StrFormat("%d graph outputs; the importer reads networks of one "
                          "output, the logits",
                          g_.output_size()));
    }
    auto v = values_.find(g_.output(0).name());
    if (v != values_.end() && v->second.node < 0) {
      return Error(absl::StrCat("the output '", g_.output(0).name(),
                                "' is the graph's input: no layer makes the logits"));
    }
    if (v == values_.end() || v->second.node != graph_.layers_size() - 1) {
      return Error(absl::StrCat("the output '", g_.output(0).name(),
                                "' is not made by the last layer read (nodes after the logits, "
                                "or an unused branch?)"));
    }
    const LayerNode& last = graph_.layers(graph_.layers_size() - 1);
    if (last.kind() != topiary::v1::linear) {
      return Error("the last layer is a " + topiary::v1::NodeKind_Name(last.kind()) +
                   ", not a linear layer making the logits");
    }
    graph_.set_classes(last.out_channels());
    return absl::OkStatus();
  }

  const onnx::ModelProto& m_;
  const onnx::GraphProto& g_;
  std::string name_;
  OnnxImportOptions options_;
  int64_t opset_ = 0;
  std::map<std::string, std::shared_ptr<const Const>> consts_;  // shared: Identity aliases
  std::map<std::string, Value> values_;
  std::map<std::string, int> consumers_;  // readers of each tensor name
  std::map<int, int64_t> uses_;           // readers of each layer's output, under any name
  std::set<std::string> used_, pending_bias_;
  std::set<std::string> inner_modules_;  // module paths with child modules (scoped names)
  NetworkGraph graph_;
  std::vector<Param> params_;
  int64_t parameter_values_ = 0;  // zero biases of linear layers without one in the file
  topiary::v1::ImportSummary summary_;
};

// The ONNX layout of `p`'s value converted to Topiary's in-memory one, checked against the
// parameter's shape. `flat_from`: a linear layer reading a flattened [h, w, c] map gets its
// columns from ONNX's (c, h, w) order.
absl::Status LoadParam(const Param& src, Parameter* p, const Shape4* flat_from,
                       const std::string& what) {
  const std::vector<int>& shape = p->value.shape();
  // The dims the file must give, in ONNX order: OIHW for [K, R, S, Cg]; [in, out] for a
  // MatMul's (or a Gemm's without transB) [out, in]; vectors by their element count.
  std::vector<int64_t> want(shape.begin(), shape.end());
  if (shape.size() == 4) want = {shape[0], shape[3], shape[1], shape[2]};
  if (shape.size() == 2 && src.transpose) want = {shape[1], shape[0]};
  const bool fits = shape.size() == 4 || shape.size() == 2
                        ? src.value.dims == want
                        : src.value.count() == static_cast<int64_t>(p->size());
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: layer '%s' %s has ONNX dims %s; the network needs %s here (ONNX order)", what,
        src.layer, ParamRoleName(src.role), DimsText(src.value.dims), DimsText(want)));
  }
  for (double x : src.value.v) {
    if (std::abs(x) > std::numeric_limits<float>::max()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: layer '%s' %s holds %g, beyond float32's range (it would become infinity)", what,
          src.layer, ParamRoleName(src.role), x));
    }
  }
  const std::vector<float> v(src.value.v.begin(), src.value.v.end());
  std::vector<float> mem = v;
  if (shape.size() == 4) {
    const int k = shape[0], r = shape[1], s = shape[2], c = shape[3];
    for (int o = 0; o < k; ++o)
      for (int i = 0; i < c; ++i)
        for (int y = 0; y < r; ++y)
          for (int x = 0; x < s; ++x)
            mem[((static_cast<size_t>(o) * r + y) * s + x) * c + i] =
                v[((static_cast<size_t>(o) * c + i) * r + y) * s + x];
  } else if (shape.size() == 2) {
    const int out = shape[0], in = shape[1];
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) {
        int from = i;  // the ONNX column of Topiary's column i
        if (flat_from && flat_from->h * flat_from->w > 1) {
          const int c = i % flat_from->c, pix = i / flat_from->c;
          from = c * flat_from->h * flat_from->w + pix;
        }
        mem[static_cast<size_t>(o) * in + i] = src.transpose
                                                   ? v[static_cast<size_t>(from) * out + o]
                                                   : v[static_cast<size_t>(o) * in + from];
      }
  }
  p->value.CopyFromHost(mem.data());
  return absl::OkStatus();
}

// The model's parameters from the reader's tensors, converted (zero where the file has none:
// the bias of a MatMul without an Add), then checked (running variances >= 0).
absl::Status LoadParams(const std::vector<Param>& params, Model& model, const std::string& name) {
  for (Parameter* p : model.parameters()) {
    std::vector<float> zeros(p->size(), 0.0f);
    p->value.CopyFromHost(zeros.data());
  }
  std::map<std::string, const Model::Node*> by_name;
  std::map<int, const Model::Node*> producer;
  for (const Model::Node& node : model.nodes()) {
    by_name[node.layer->name()] = &node;
    producer[node.output] = &node;
  }
  for (const Param& src : params) {
    const Model::Node* node = by_name.at(src.layer);
    Parameter* p = node->layer->parameter(src.role);
    if (p == nullptr) return absl::InternalError(src.layer + ": no such parameter");
    const Shape4* flat_from = nullptr;
    if (node->layer->kind() == LayerKind::kLinear && src.role == ParamRole::kKernel) {
      auto it = producer.find(node->inputs[0]);
      if (it != producer.end() && it->second->layer->kind() == LayerKind::kFlatten) {
        flat_from = &model.value_shapes()[it->second->inputs[0]];
      }
    }
    TOPIARY_RETURN_IF_ERROR(LoadParam(src, p, flat_from, name));
  }
  for (const Model::Node& node : model.nodes()) {
    if (node.layer->kind() != LayerKind::kBatchNorm) continue;
    const Parameter& var = *node.layer->parameter(ParamRole::kRunningVar);
    for (float x : std::vector<float>(var.value.data(), var.value.data() + var.size())) {
      if (x < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": ", node.layer->name(), ": a negative running variance"));
      }
    }
  }
  return absl::OkStatus();
}

// What the checkpoint records the network reads: the graph's image and the options'
// normalization (one value for every channel, or one per channel).
absl::StatusOr<topiary::v1::InputFormat> InputFormatFor(const NetworkGraph& graph,
                                                        const OnnxImportOptions& options) {
  const int c = graph.channels();
  if (!(options.max_value > 0 && std::isfinite(options.max_value))) {
    return absl::InvalidArgumentError("--max_value: must be positive and finite");
  }
  for (const auto* v : {&options.mean, &options.std}) {
    if (!v->empty() && static_cast<int>(v->size()) != c && v->size() != 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--mean and --std take 1 or %d values (the input's channels), not %d", c, v->size()));
    }
  }
  topiary::v1::InputFormat in;
  in.set_layout("NHWC");
  in.set_height(graph.height());
  in.set_width(graph.width());
  in.set_channels(c);
  in.set_classes(graph.classes());
  in.set_max_value(options.max_value);
  for (int k = 0; k < c; ++k) {
    const float mean = options.mean.empty() ? 0.0f : options.mean[options.mean.size() == 1 ? 0 : k];
    const float std = options.std.empty() ? 1.0f : options.std[options.std.size() == 1 ? 0 : k];
    if (!(std > 0) || !std::isfinite(std) || !std::isfinite(mean)) {
      return absl::InvalidArgumentError("--std: must be positive and finite, --mean finite");
    }
    in.add_mean(mean);
    in.add_inv_std(1.0f / std);
  }
  return in;
}

}  // namespace

absl::StatusOr<ImportedModel> ImportOnnx(const std::string& bytes, const std::string& name,
                                         const OnnxImportOptions& options, Device* device) {
  onnx::ModelProto proto;
  if (!proto.ParseFromString(bytes)) {
    return absl::InvalidArgumentError(
        name + ": not an ONNX model (the protobuf does not parse: truncated or another format)");
  }
  Reader reader(proto, name, options);
  TOPIARY_RETURN_IF_ERROR(reader.Read());
  NetworkGraph& graph = reader.graph();
  std::string stem = name.substr(name.find_last_of('/') + 1);
  stem = stem.substr(0, stem.rfind(".onnx"));
  graph.set_arch(options.arch.empty() ? "onnx:" + CleanName(stem) : options.arch);
  ImportedModel out;
  TOPIARY_ASSIGN_OR_RETURN(out.input, InputFormatFor(graph, options));
  TOPIARY_ASSIGN_OR_RETURN(out.model,
                           BuildModelFromGraph(graph, device, name, reader.parameter_values()));
  TOPIARY_RETURN_IF_ERROR(LoadParams(reader.params(), *out.model, name));
  out.summary = reader.summary();
  topiary::v1::ImportSummary& s = out.summary;
  s.set_arch(graph.arch());
  s.set_onnx_nodes(proto.graph().node_size());
  s.set_layers(graph.layers_size());
  s.set_parameters(out.model->trainable_parameter_count());
  s.set_height(graph.height());
  s.set_width(graph.width());
  s.set_channels(graph.channels());
  s.set_classes(graph.classes());
  return out;
}

absl::StatusOr<topiary::v1::ImportSummary> ImportOnnxFile(const std::string& onnx_path,
                                                          const std::string& out_path,
                                                          const OnnxImportOptions& options) {
  TOPIARY_ASSIGN_OR_RETURN(std::string bytes, ReadFile(onnx_path, kMaxFileBytes));
  topiary::v1::DeviceSpec cpu;
  cpu.set_kind(topiary::v1::DeviceSpec::CPU);
  TOPIARY_ASSIGN_OR_RETURN(auto device, CreateDevice(cpu));
  TOPIARY_ASSIGN_OR_RETURN(ImportedModel imported,
                           ImportOnnx(bytes, onnx_path, options, device.get()));
  CheckpointState state;
  state.input = imported.input;
  state.parent = onnx_path;
  if (!options.data.empty()) {
    topiary::v1::ExperimentSpec spec;  // no model: the checkpoint's graph is the network
    TOPIARY_ASSIGN_OR_RETURN(
        *spec.mutable_data(),
        ParseDataFlag(options.data, imported.input.height(), imported.input.channels()));
    state.spec_text = SpecToText(spec);
  }
  TOPIARY_RETURN_IF_ERROR(
      SaveCheckpoint(out_path, *imported.model, state,
                     options.create_only ? WriteMode::kCreate : WriteMode::kReplace));
  imported.summary.set_checkpoint(out_path);
  return imported.summary;
}

}  // namespace topiary
