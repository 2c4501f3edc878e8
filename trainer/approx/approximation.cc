#include "trainer/approx/approximation.h"

#include "absl/strings/str_cat.h"
#include "kernels/approx/approx_conv.h"
#include "trainer/nn/layers.h"
#include "trainer/util/glob.h"
#include "util/status_macros.h"

namespace topiary {

absl::StatusOr<std::vector<std::optional<Multiplier>>> LoadRuleMultipliers(
    const topiary::v1::ApproximationSpec& spec) {
  std::vector<std::optional<Multiplier>> out;
  for (int i = 0; i < spec.rules_size(); ++i) {
    const auto& rule = spec.rules(i);
    if (rule.exclude()) {
      out.emplace_back();
      continue;
    }
    auto m = LoadMultiplier(rule.multiplier());
    if (!m.ok()) {
      return absl::Status(m.status().code(), absl::StrCat("approximation.rules[", i,
                                                          "].multiplier: ", m.status().message()));
    }
    out.emplace_back(std::move(*m));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, int>>> MatchApproximationRules(
    const topiary::v1::ApproximationSpec& spec, const Model& model) {
  std::vector<bool> used(spec.rules_size(), false);
  std::vector<std::pair<std::string, int>> out;
  for (const Model::Node& node : model.nodes()) {
    if (node.layer->kind() != LayerKind::kConv2d) continue;
    int chosen = -1;
    for (int i = 0; i < spec.rules_size(); ++i) {
      if (GlobMatch(spec.rules(i).layer(), node.layer->name())) {
        chosen = i;
        used[i] = true;
      }
    }
    if (chosen >= 0 && !spec.rules(chosen).exclude()) out.emplace_back(node.layer->name(), chosen);
  }
  for (int i = 0; i < spec.rules_size(); ++i) {
    if (!used[i]) {
      return absl::InvalidArgumentError(absl::StrCat("approximation.rules[", i, "].layer: '",
                                                     spec.rules(i).layer(),
                                                     "' matches no convolution of ", model.arch()));
    }
  }
  return out;
}

topiary::v1::ApproximationSpec AssignmentRules(
    const topiary::v1::ApproximationSpec& base,
    const std::vector<std::pair<std::string, std::string>>& layers) {
  topiary::v1::ApproximationSpec a;
  a.set_range(base.range());
  a.set_weight_tuning(base.weight_tuning());
  a.set_weight_code(base.weight_code());
  a.set_per_channel_weights(base.per_channel_weights());
  for (const auto& [layer, multiplier] : layers) {
    auto* r = a.add_rules();
    r->set_layer(layer);
    if (multiplier.empty()) {
      r->set_exclude(true);
    } else {
      r->set_multiplier(multiplier);
    }
  }
  return a;
}

absl::Status ApplyApproximation(const topiary::v1::ApproximationSpec& spec, Model* model) {
  TOPIARY_ASSIGN_OR_RETURN(auto layers, MatchApproximationRules(spec, *model));
  TOPIARY_ASSIGN_OR_RETURN(auto multipliers, LoadRuleMultipliers(spec));
  // One tuned table per rule, shared by every layer the rule covers.
  std::vector<std::vector<uint16_t>> tables(multipliers.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    const auto& m = (multipliers)[i];
    if (!m) continue;
    tables[i] =
        FromSpec(kSpecWeightCodes, spec.weight_code()) == kernels::WeightCode::kSignMagnitude
            ? kernels::SignMagnitudeTable(m->table)
        : spec.weight_tuning() ? WeightTuned(m->table)
                               : m->table;
  }
  for (const auto& [name, rule] : layers) {
    const Multiplier& m = *(multipliers)[rule];
    ConvApproximation a;
    a.multiplier = spec.rules(rule).multiplier();
    a.sha256 = m.sha256;
    a.weight_tuning = spec.weight_tuning();
    a.weights.code = FromSpec(kSpecWeightCodes, spec.weight_code());
    // The spec's one bool of the approximation: the engine's enum from here on.
    a.weights.scales = spec.per_channel_weights() ? kernels::WeightScales::kPerChannel
                                                  : kernels::WeightScales::kPerTensor;
    a.range = FromSpec(kSpecRanges, spec.range());
    a.table = tables[rule];
    auto* conv = static_cast<Conv2d*>(model->FindLayer(name));
    if (auto st = conv->Approximate(std::move(a), model->device()); !st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("approximation.rules[", rule, "]: ", st.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace topiary
