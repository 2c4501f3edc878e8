#include "trainer/nn/channels.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/nn/graph.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/masks.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::LayerNode;
using topiary::v1::NetworkGraph;

bool Depthwise(const LayerNode& n, int in_channels) {
  return n.kind() == topiary::v1::grouped_conv2d && n.groups() == in_channels &&
         n.out_channels() == in_channels;
}

// Channel slots joined by couplings (union-find). A slot is one producer row; a depthwise
// convolution's rows and the couplings are recorded against slots and resolved to classes at
// the end.
class Slots {
 public:
  int Make(ChannelRow row) {
    parent_.push_back(static_cast<int>(parent_.size()));
    rows_.push_back({row});
    fixed_.emplace_back();
    return parent_.back();
  }
  int Find(int s) {
    while (parent_[s] != s) s = parent_[s] = parent_[parent_[s]];
    return s;
  }
  void Join(int a, int b) {
    a = Find(a);
    b = Find(b);
    if (a == b) return;
    parent_[b] = a;
    rows_[a].insert(rows_[a].end(), rows_[b].begin(), rows_[b].end());
    rows_[b].clear();
    if (fixed_[a].empty()) fixed_[a] = fixed_[b];
  }
  void AddRow(int s, ChannelRow row) { rows_[Find(s)].push_back(row); }
  void Fix(int s, const std::string& why) {
    std::string& f = fixed_[Find(s)];
    if (f.empty()) f = why;
  }
  int size() const { return static_cast<int>(parent_.size()); }
  const std::vector<ChannelRow>& rows(int root) const { return rows_[root]; }
  const std::string& fixed(int root) const { return fixed_[root]; }

 private:
  std::vector<int> parent_;
  std::vector<std::vector<ChannelRow>> rows_;
  std::vector<std::string> fixed_;
};

constexpr int kImage = -1;  // a channel of the image: in no class, never removed

// Which channels of a value are kept: every channel whose class is not removed.
std::vector<int> Kept(const std::vector<int>& classes, const std::vector<bool>& remove) {
  std::vector<int> kept;
  for (int j = 0; j < static_cast<int>(classes.size()); ++j) {
    if (classes[j] == kImage || !remove[classes[j]]) kept.push_back(j);
  }
  return kept;
}

// v[rows][middle][cols] with only the rows in `rows` and the columns in `cols` (null: all).
template <typename T>
std::vector<T> Slice(const std::vector<T>& v, int64_t n_rows, int64_t n_cols,
                     const std::vector<int>* rows, const std::vector<int>* cols) {
  const int64_t middle = static_cast<int64_t>(v.size()) / (n_rows * n_cols);
  std::vector<int> all_rows, all_cols;
  if (!rows) {
    all_rows.resize(n_rows);
    std::iota(all_rows.begin(), all_rows.end(), 0);
    rows = &all_rows;
  }
  if (!cols) {
    all_cols.resize(n_cols);
    std::iota(all_cols.begin(), all_cols.end(), 0);
    cols = &all_cols;
  }
  std::vector<T> out;
  out.reserve(rows->size() * middle * cols->size());
  for (int r : *rows) {
    for (int64_t m = 0; m < middle; ++m) {
      const T* row = v.data() + (r * middle + m) * n_cols;
      for (int c : *cols) out.push_back(row[c]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ChannelGroups> FindChannelGroups(const Model& model) {
  const NetworkGraph graph = DescribeModel(model);
  const auto& nodes = model.nodes();
  const auto& shapes = model.value_shapes();
  Slots slots;
  // Per value: the slot of each channel (kImage for the image's).
  std::vector<std::vector<int>> value_slots(shapes.size());
  value_slots[0].assign(shapes[0].c, kImage);
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const LayerNode& n = graph.layers(i);
    const std::vector<int>& in = value_slots[nodes[i].inputs[0]];
    std::vector<int>& out = value_slots[nodes[i].output];
    const int channels = shapes[nodes[i].output].c;
    const std::string at = absl::StrCat("layer '", n.name(), "'");
    switch (n.kind()) {
      case topiary::v1::conv2d:
      case topiary::v1::linear:
        for (int c = 0; c < channels; ++c) out.push_back(slots.Make({i, c}));
        break;
      case topiary::v1::grouped_conv2d:
        if (Depthwise(n, static_cast<int>(in.size()))) {
          out = in;  // output channel c is input channel c, filtered
          for (int c = 0; c < channels; ++c) {
            if (in[c] == kImage) {
              return absl::InvalidArgumentError(
                  at + ": a depthwise convolution of the image itself (its channels cannot go)");
            }
            slots.AddRow(in[c], {i, c});
          }
        } else {
          const std::string why = absl::StrFormat(
              "%s: a grouped convolution (%d groups) ties its channels group by group", at,
              n.groups());
          for (int s : in) {
            if (s != kImage) slots.Fix(s, why);
          }
          for (int c = 0; c < channels; ++c) {
            out.push_back(slots.Make({i, c}));
            slots.Fix(out.back(), why);
          }
        }
        break;
      case topiary::v1::add:
      case topiary::v1::mul: {  // channel c meets channel c (a per-channel scale's too)
        const std::vector<int>& other = value_slots[nodes[i].inputs[1]];
        out = in;
        for (int c = 0; c < channels; ++c) {
          if ((in[c] == kImage) != (other[c] == kImage)) {
            const int s = in[c] == kImage ? other[c] : in[c];
            slots.Fix(s, at + ": adds these channels to the image's");
          } else if (in[c] != kImage) {
            slots.Join(in[c], other[c]);
          }
        }
        break;
      }
      case topiary::v1::concat:
        for (int v : nodes[i].inputs) {
          out.insert(out.end(), value_slots[v].begin(), value_slots[v].end());
        }
        break;
      case topiary::v1::flatten:
        // NHWC: position p of the vector is channel p % C of the image it flattens.
        for (int p = 0; p < channels; ++p) out.push_back(in[p % in.size()]);
        break;
      default:  // batch norm, ReLU, pooling: channel for channel
        out = in;
    }
    if (static_cast<int>(out.size()) != channels) {
      return absl::InternalError(
          absl::StrFormat("%s: %d channels traced for %d", at, out.size(), channels));
    }
  }
  for (int s : value_slots[model.output()]) {
    if (s != kImage) slots.Fix(s, "the logits (the network's output) keep every channel");
  }

  // Classes: one per slot root, numbered in the order their first slot was made.
  ChannelGroups g;
  std::vector<int> class_of(slots.size(), -1);
  std::vector<std::string> class_fixed;
  for (int s = 0; s < slots.size(); ++s) {
    const int root = slots.Find(s);
    if (class_of[root] < 0) {
      class_of[root] = static_cast<int>(g.classes.size());
      g.classes.push_back({slots.rows(root)});
      class_fixed.push_back(slots.fixed(root));
    }
    class_of[s] = class_of[root];
  }
  g.value_classes.resize(value_slots.size());
  for (size_t v = 0; v < value_slots.size(); ++v) {
    for (int s : value_slots[v]) g.value_classes[v].push_back(s == kImage ? kImage : class_of[s]);
  }
  // Groups: classes with the same producers.
  std::map<std::vector<int>, int> group_of;
  for (int k = 0; k < static_cast<int>(g.classes.size()); ++k) {
    std::vector<int> layers;
    for (const ChannelRow& r : g.classes[k].rows) layers.push_back(r.layer);
    std::sort(layers.begin(), layers.end());
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    auto [it, fresh] = group_of.try_emplace(layers, static_cast<int>(g.groups.size()));
    if (fresh) g.groups.push_back({graph.layers(layers[0]).name(), layers, {}, ""});
    DependencyGroup& group = g.groups[it->second];
    group.classes.push_back(k);
    if (group.fixed.empty()) group.fixed = class_fixed[k];
  }
  return g;
}

absl::StatusOr<NetworkGraph> CompactGraph(const Model& model, const ChannelGroups& groups,
                                          const std::vector<bool>& remove) {
  if (remove.size() != groups.classes.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d channel classes marked for %d in the network", remove.size(), groups.classes.size()));
  }
  for (const DependencyGroup& group : groups.groups) {
    if (group.fixed.empty()) continue;
    for (int k : group.classes) {
      if (remove[k]) {
        return absl::InvalidArgumentError(
            absl::StrCat("channels of group '", group.name, "' cannot be removed: ", group.fixed));
      }
    }
  }
  NetworkGraph graph = DescribeModel(model);
  const auto& nodes = model.nodes();
  for (int i = 0; i < graph.layers_size(); ++i) {
    LayerNode* n = graph.mutable_layers(i);
    const int kept = static_cast<int>(Kept(groups.value_classes[nodes[i].output], remove).size());
    if (kept == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer '", n->name(), "' would keep no channel (every class of its output is removed)"));
    }
    if (n->kind() == topiary::v1::grouped_conv2d && n->groups() == n->out_channels()) {
      n->set_groups(kept);  // depthwise: fixed groups never lose channels
    }
    if (n->out_channels() > 0 && kept != n->out_channels()) {
      if (n->original_out_channels() == 0) n->set_original_out_channels(n->out_channels());
      n->set_out_channels(kept);
    }
  }
  return graph;
}

namespace {

// What a block or N:M mask is after its kernel lost channels: still a block mask where the
// sliced mask is whole blocks of the same shape, still N:M where every group of m input
// channels keeps at most n (and the inputs are whole groups); otherwise an element mask, the
// same zeros without the structure (kernels made for the structure no longer apply to it).
MaskInfo SlicedMaskInfo(const MaskInfo& info, const std::vector<uint8_t>& mask, int out, int in) {
  const int taps = static_cast<int>(mask.size() / (static_cast<size_t>(out) * in));
  auto at = [&](int k, int t, int c) {
    return mask[(static_cast<size_t>(k) * taps + t) * in + c] != 0;
  };
  MaskInfo element;
  element.kind = MaskInfo::Kind::kElement;
  if (info.kind == MaskInfo::Kind::kBlock) {
    MaskInfo block = info;
    block.blocks = kernels::BlockGrid::Dense(in, out, info.blocks.block_in, info.blocks.block_out);
    for (int k = 0; k < out; ++k) {
      for (int c = 0; c < in; ++c) {
        if (!at(k, 0, c))
          block.blocks.at(c / block.blocks.block_in, k / block.blocks.block_out) = 0;
      }
    }
    return block.blocks.Expand(out, taps, in) == mask ? block : element;
  }
  if (info.kind == MaskInfo::Kind::kNofM) {
    if (info.m <= 0 || in % info.m != 0) return element;
    for (int k = 0; k < out; ++k) {
      for (int t = 0; t < taps; ++t) {
        for (int c0 = 0; c0 < in; c0 += info.m) {
          int kept = 0;
          for (int j = 0; j < info.m; ++j) kept += at(k, t, c0 + j);
          if (kept > info.n) return element;
        }
      }
    }
    return info;
  }
  return info;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CompactModel(
    const Model& model, const ChannelGroups& groups, const std::vector<bool>& remove,
    const std::function<absl::Status(Model*)>& prepare) {
  TOPIARY_ASSIGN_OR_RETURN(NetworkGraph graph, CompactGraph(model, groups, remove));
  TOPIARY_ASSIGN_OR_RETURN(std::unique_ptr<Model> small,
                           BuildModelFromGraph(graph, model.device(), "compacted network"));
  if (prepare) TOPIARY_RETURN_IF_ERROR(prepare(small.get()));
  // Per layer: the kept channels of its output and of its (first) input.
  std::map<std::string, std::pair<std::vector<int>, std::vector<int>>> kept;
  for (const Model::Node& node : model.nodes()) {
    kept[node.layer->name()] = {Kept(groups.value_classes[node.output], remove),
                                Kept(groups.value_classes[node.inputs[0]], remove)};
  }
  std::map<std::string, Parameter*> targets;
  for (Parameter* p : small->parameters()) targets[p->full_name()] = p;
  for (const Parameter* p : model.parameters()) {
    Parameter* q = targets.at(p->full_name());
    const auto& [out, in] = kept.at(p->layer);
    const std::vector<int>& shape = p->value.shape();
    // Kernels: [out, ..., in] (a depthwise kernel's last axis is 1: rows only); per-channel
    // vectors: [channels]; the activation range is not per channel.
    const bool per_channel = p->role != ParamRole::kActivationRange;
    const LayerKind kind = model.FindLayer(p->layer)->kind();
    const bool columns =
        p->role == ParamRole::kKernel && (kind == LayerKind::kConv2d || kind == LayerKind::kLinear);
    const int64_t n_rows = shape[0], n_cols = p->role == ParamRole::kKernel ? shape.back() : 1;
    auto slice = [&](const auto& v) {
      return per_channel ? Slice(v, n_rows, n_cols, &out, columns ? &in : nullptr) : v;
    };
    const std::vector<float> value = slice(p->value.ToHost());
    if (value.size() != q->value.size()) {
      return absl::InternalError(absl::StrFormat("%s: %d values sliced for %d", p->full_name(),
                                                 value.size(), q->value.size()));
    }
    q->value.CopyFromHost(value.data());
    if (!p->momentum.empty()) q->momentum.CopyFromHost(slice(p->momentum.ToHost()).data());
    if (p->mask_info.kind == MaskInfo::Kind::kNone) continue;
    const std::vector<uint8_t> mask = slice(HostMask(*p));
    const std::vector<int>& small_shape = q->value.shape();
    TOPIARY_RETURN_IF_ERROR(InstallMask(
        q, mask, SlicedMaskInfo(p->mask_info, mask, small_shape[0], small_shape.back()), false));
  }
  return small;
}

namespace {

// Calls f(node, per_pair, depthwise) for each convolution and linear layer: the
// multiply-adds per image of each (output channel, input channel position) pair it connects,
// and whether each output channel reads only its own input channel (depthwise). A grouped
// convolution connects each output channel with in/groups input channels: per_pair is then
// scaled down by groups, which is exact for whole-layer sums.
template <typename F>
void ForEachProduct(const Model& model, F f) {
  const NetworkGraph graph = DescribeModel(model);
  const auto& shapes = model.value_shapes();
  for (size_t i = 0; i < model.nodes().size(); ++i) {
    const Model::Node& node = model.nodes()[i];
    const LayerNode& n = graph.layers(static_cast<int>(i));
    const Shape4& out = shapes[node.output];
    const int64_t positions = int64_t{out.h} * out.w;
    const int64_t taps = int64_t{n.kernel_h()} * n.kernel_w();
    switch (n.kind()) {
      case topiary::v1::conv2d:
        f(node, positions * taps, 1, false);
        break;
      case topiary::v1::grouped_conv2d: {
        const bool depthwise = Depthwise(n, shapes[node.inputs[0]].c);
        f(node, positions * taps, depthwise ? 1 : n.groups(), depthwise);
        break;
      }
      case topiary::v1::linear:
        f(node, int64_t{1}, 1, false);
        break;
      default:
        break;
    }
  }
}

// The multiply-adds per image when each value v of the model has width(v) channels.
template <typename W>
int64_t MultiplyAddsAt(const Model& model, W width) {
  int64_t total = 0;
  ForEachProduct(
      model, [&](const Model::Node& node, int64_t per_pair, int groups_div, bool depthwise) {
        const int64_t outs = width(node.output);
        total += depthwise ? per_pair * outs : per_pair * outs * width(node.inputs[0]) / groups_div;
      });
  return total;
}

}  // namespace

int64_t MultiplyAdds(const Model& model) {
  return MultiplyAddsAt(model, [&](int v) -> int64_t { return model.value_shapes()[v].c; });
}

int64_t MultiplyAdds(const Model& model, const ChannelGroups& groups,
                     const std::vector<bool>& remove) {
  return MultiplyAddsAt(model, [&](int v) -> int64_t {
    return static_cast<int64_t>(Kept(groups.value_classes[v], remove).size());
  });
}

int64_t DenseMultiplyAdds(const Model& model) {
  // Spatial sizes do not depend on widths: only the channel counts change, value by value.
  const NetworkGraph graph = DescribeModel(model);
  const auto& shapes = model.value_shapes();
  std::vector<int64_t> dense(shapes.size());
  dense[0] = shapes[0].c;
  for (size_t i = 0; i < model.nodes().size(); ++i) {
    const Model::Node& node = model.nodes()[i];
    const LayerNode& n = graph.layers(static_cast<int>(i));
    int64_t& d = dense[node.output];
    if (n.out_channels() > 0) {  // convolutions and linear layers
      d = n.original_out_channels() > 0 ? n.original_out_channels() : n.out_channels();
    } else if (n.kind() == topiary::v1::concat) {
      d = 0;
      for (int v : node.inputs) d += dense[v];
    } else if (n.kind() == topiary::v1::flatten) {
      const Shape4& s = shapes[node.inputs[0]];
      d = dense[node.inputs[0]] * s.h * s.w;
    } else {
      d = dense[node.inputs[0]];
    }
  }
  return MultiplyAddsAt(model, [&](int v) { return dense[v]; });
}

std::vector<int64_t> ClassMultiplyAdds(const Model& model, const ChannelGroups& groups) {
  std::vector<int64_t> saved(groups.classes.size(), 0);
  ForEachProduct(
      model, [&](const Model::Node& node, int64_t per_pair, int groups_div, bool depthwise) {
        const std::vector<int>& outs = groups.value_classes[node.output];
        const std::vector<int>& ins = groups.value_classes[node.inputs[0]];
        const int64_t per_out = depthwise ? per_pair : per_pair * ins.size() / groups_div;
        const int64_t per_in = per_pair * outs.size() / groups_div;
        for (int k : outs) {
          if (k != kImage) saved[k] += per_out;
        }
        if (depthwise) return;  // its input channel is its output channel, counted once
        for (int k : ins) {
          if (k != kImage) saved[k] += per_in;
        }
      });
  return saved;
}

void ZeroChannels(Model* model, const ChannelGroups& groups, const std::vector<bool>& remove) {
  std::map<std::string, int> layer_index;
  const auto& nodes = model->nodes();
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) layer_index[nodes[i].layer->name()] = i;
  for (Parameter* p : model->parameters()) {
    const bool row_of_producer = p->role == ParamRole::kKernel || p->role == ParamRole::kBias;
    const bool affine = p->role == ParamRole::kGamma || p->role == ParamRole::kBeta;
    if (!row_of_producer && !affine) continue;  // statistics and ranges are left as they are
    const std::vector<int>& classes = groups.value_classes[nodes[layer_index.at(p->layer)].output];
    std::vector<float> v = p->value.ToHost();
    const size_t row = v.size() / classes.size();
    for (size_t c = 0; c < classes.size(); ++c) {
      if (classes[c] == kImage || !remove[classes[c]]) continue;
      std::fill(v.begin() + c * row, v.begin() + (c + 1) * row, 0.0f);
    }
    p->value.CopyFromHost(v.data());
  }
}

}  // namespace topiary
