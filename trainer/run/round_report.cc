#include "trainer/run/round_report.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/nn/channels.h"
#include "trainer/nn/masks.h"

namespace topiary {
namespace {

using topiary::v1::LayerSparsity;
using topiary::v1::RoundSummary;

topiary::v1::MaskKind MaskKindOf(MaskInfo::Kind kind) {
  switch (kind) {
    case MaskInfo::Kind::kBlock:
      return topiary::v1::MASK_BLOCK;
    case MaskInfo::Kind::kElement:
      return topiary::v1::MASK_ELEMENT;
    case MaskInfo::Kind::kNofM:
      return topiary::v1::MASK_N_OF_M;
    case MaskInfo::Kind::kNone:
      break;
  }
  return topiary::v1::MASK_NONE;
}

// A layer's measured block-sparse dispatch (trainer/nn/sparse_dispatch.h) in a round's report.
void SetEngineChoice(const SparseConvChoice& c, LayerSparsity* l) {
  topiary::v1::ConvPassChoice* passes[3] = {l->mutable_forward(), l->mutable_backward_data(),
                                            l->mutable_backward_filter()};
  for (int i = 0; i < 3; ++i) {
    passes[i]->set_chosen(c.sparse[i] ? topiary::v1::ConvPassChoice::BLOCK_SPARSE
                                      : topiary::v1::ConvPassChoice::DENSE);
    passes[i]->set_dense_ms(c.dense_ms[i]);
    passes[i]->set_sparse_ms(c.sparse_ms[i]);
    passes[i]->set_config(c.config[i]);
  }
}

void AddStepReports(const std::vector<LayerPruneReport>& reports, RoundSummary* row) {
  for (const LayerPruneReport& r : reports) {
    for (LayerSparsity& l : *row->mutable_layers()) {
      if (l.layer() != r.layer) continue;
      l.set_target_units(r.target_zeros);
      if (r.requested_zeros > r.target_zeros) l.set_requested_units(r.requested_zeros);
      l.set_fallback(r.fallback);
      l.set_zero_units_before(r.zeros_before);
    }
    row->set_layers_pruned(row->layers_pruned() + 1);
    row->set_layers_at_target(row->layers_at_target() + (r.reached ? 1 : 0));
    row->set_layers_stalled(row->layers_stalled() + (r.stalled && !r.reached ? 1 : 0));
  }
}

}  // namespace

RoundSummary SparsityRow(const Model& model, const SparseConvChoices& choices, int round,
                         const std::vector<LayerPruneReport>* reports) {
  RoundSummary row;
  row.set_round(round);
  int64_t total = 0, zeros = 0;
  for (const Model::Node& node : model.nodes()) {
    for (Parameter* p : node.layer->parameters()) {
      if (p->role != ParamRole::kKernel) continue;
      const int64_t masked = MaskedCount(*p);
      total += static_cast<int64_t>(p->size());
      zeros += masked;
      if (p->mask_info.kind == MaskInfo::Kind::kNone) continue;
      LayerSparsity* l = row.add_layers();
      l->set_layer(p->layer);
      l->set_mask(MaskKindOf(p->mask_info.kind));
      l->set_sparsity(static_cast<double>(masked) / p->size());
      if (p->mask_info.kind == MaskInfo::Kind::kBlock) {
        l->set_units(static_cast<int64_t>(p->mask_info.blocks.kept.size()));
        l->set_zero_units(p->mask_info.blocks.zeros());
        for (const auto& [layer, choice] : choices) {
          if (layer == p->layer) SetEngineChoice(choice, l);
        }
      } else {
        l->set_units(static_cast<int64_t>(p->size()));
        l->set_zero_units(masked);
      }
    }
  }
  if (reports != nullptr) AddStepReports(*reports, &row);
  row.set_sparsity(total > 0 ? static_cast<double>(zeros) / total : 0);
  row.set_multiply_adds(MultiplyAdds(model));
  row.set_parameters(model.trainable_parameter_count());
  return row;
}

std::string TargetNote(const topiary::v1::PruningSpec& pruning, const RoundSummary& last,
                       const RoundSummary& now, int rounds, const std::string& why) {
  std::vector<std::string> short_layers;
  for (const LayerSparsity& l : last.layers()) {
    if (l.target_units() > 0 && l.zero_units() < l.target_units()) {
      short_layers.push_back(absl::StrFormat("%s %.1f%%", l.layer(), 100 * l.sparsity()));
    }
  }
  const size_t shown = std::min<size_t>(short_layers.size(), 4);
  std::string layers;
  if (!short_layers.empty()) {
    layers = "; short of their target: " +
             absl::StrJoin(short_layers.begin(), short_layers.begin() + shown, ", ");
    if (short_layers.size() > shown) {
      absl::StrAppendFormat(&layers, " and %d more", short_layers.size() - shown);
    }
  }
  return absl::StrFormat("target %.1f%% not reached: %s; sparsity %.1f%% after %d round(s)%s",
                         100 * pruning.target(), why, 100 * now.sparsity(), rounds, layers);
}

}  // namespace topiary
