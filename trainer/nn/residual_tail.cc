#include "trainer/nn/residual_tail.h"

#include "trainer/nn/layers.h"
#include "trainer/nn/model.h"
#include "util/status_macros.h"

namespace topiary {

std::vector<std::unique_ptr<ResidualTail>> ResidualTail::Find(const Model& model,
                                                              kernels::DType t) {
  const auto& nodes = model.nodes();
  const size_t values = model.value_shapes().size();
  std::vector<int> producer(values, -1), readers(values, 0);
  for (size_t j = 0; j < nodes.size(); ++j) {
    producer[nodes[j].output] = static_cast<int>(j);
    for (int v : nodes[j].inputs) ++readers[v];
  }
  ++readers[model.output()];  // the loss
  // The node of a batch norm that can fold into the add reading value v, else -1.
  auto foldable = [&](int v) {
    const int p = producer[v];
    if (p < 0 || readers[v] != 1 || nodes[p].layer->kind() != LayerKind::kBatchNorm) return -1;
    const auto* bn = static_cast<const BatchNorm2d*>(nodes[p].layer);
    return bn->fused_relu() || nodes[p].inputs[0] == 0 ? -1 : p;
  };
  std::vector<std::unique_ptr<ResidualTail>> out;
  for (size_t j = 0; j < nodes.size(); ++j) {
    const Model::Node& node = nodes[j];
    if (node.layer->kind() != LayerKind::kAdd || node.inputs[0] == node.inputs[1]) continue;
    if (!kernels::ResidualTailFusableCuda(t, model.value_shapes()[node.output].c)) continue;
    const int bn0 = foldable(node.inputs[0]), bn1 = foldable(node.inputs[1]);
    if (bn0 < 0 && bn1 < 0) continue;
    out.emplace_back(new ResidualTail(model, static_cast<int>(j), bn0, bn1));
  }
  return out;
}

ResidualTail::ResidualTail(const Model& model, int add, int bn0, int bn1)
    : model_(model), add_(add), bn_{bn0, bn1}, a_(bn0 >= 0 ? 0 : 1) {
  const Model::Node& node = model.nodes()[add];
  shape_.c = model.value_shapes()[node.output].c;
  shape_.relu = static_cast<const Add*>(node.layer)->fused_relu();
}

absl::Status ResidualTail::Prepare(int batch, Device* device, int sync_ranks,
                                   size_t* workspace_bytes) {
  const Shape4& s = model_.value_shapes()[model_.nodes()[add_].output];
  shape_.m = static_cast<int64_t>(batch) * s.h * s.w;
  TOPIARY_ASSIGN_OR_RETURN(auto ss, Buffer<float>::Create(device, 4 * static_cast<size_t>(s.c)));
  scale_shift_ = std::move(ss);
  *workspace_bytes = kernels::ResidualTailWorkspaceFloatsCuda(shape_, sync_ranks) * sizeof(float);
  return absl::OkStatus();
}

absl::Status ResidualTail::ForwardBatchNorm(int node, const LayerIo& io, bool training) {
  const int k = node == bn_[0] ? 0 : 1;
  auto* bn = static_cast<BatchNorm2d*>(model_.nodes()[node].layer);
  return bn->ForwardFolded(io, training,
                           scale_shift_.data() + 2 * static_cast<size_t>(k) * shape_.c);
}

kernels::FoldedBatchNorm ResidualTail::Input(int k, const std::vector<LayerIo>& io) const {
  if (bn_[k] < 0) {
    kernels::FoldedBatchNorm identity;
    identity.x = io[add_].x[k];
    return identity;
  }
  const auto* bn = static_cast<const BatchNorm2d*>(model_.nodes()[bn_[k]].layer);
  return bn->Folded(io[bn_[k]], scale_shift_.data() + 2 * static_cast<size_t>(k) * shape_.c);
}

void* ResidualTail::GradientBuffer(const LayerIo& add_io) const {
  return add_io.dx[b()] != nullptr ? add_io.dx[b()] : add_io.dx[a()];
}

absl::Status ResidualTail::Forward(const std::vector<LayerIo>& io) const {
  const LayerIo& add_io = io[add_];
  return kernels::ResidualTailForwardCuda(add_io.dtype, shape_, Input(a(), io), Input(b(), io),
                                          add_io.y, *add_io.cuda);
}

absl::Status ResidualTail::Backward(const std::vector<LayerIo>& io) const {
  const LayerIo& add_io = io[add_];
  return kernels::ResidualTailBackwardCuda(add_io.dtype, shape_, add_io.y, add_io.dy, add_io.dy2,
                                           Input(a(), io), Input(b(), io), GradientBuffer(add_io),
                                           static_cast<float*>(add_io.workspace), *add_io.cuda,
                                           add_io.batch_norm_sync);
}

}  // namespace topiary
