#include "pruning/channel_select.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pruning/overrides.h"
#include "trainer/nn/layer.h"
#include "util/status_macros.h"

namespace topiary::pruning {
namespace {

using topiary::v1::PruningSpec;

// Sum, sum of squares and count of a class's per-weight quantities.
struct Moments {
  double sum = 0, sum_sq = 0, count = 0;
  void Add(double x) {
    sum += x;
    sum_sq += x * x;
    count += 1;
  }
  double mean() const { return count > 0 ? sum / count : 0; }
  double variance() const {
    return count > 0 ? std::max(0.0, sum_sq / count - mean() * mean()) : 0;
  }
};

// The share of the way to the target that round `round` asks for.
double Progress(const PruningSpec& spec, int round) {
  return std::min(1.0, round * static_cast<double>(spec.step_fraction()));
}

// What the spec's overrides say of a group: excluded (why), or its target.
struct GroupRule {
  double target = 0;
  std::string excluded;
};

absl::StatusOr<std::vector<GroupRule>> GroupRules(const Model& model, const ChannelGroups& groups,
                                                  const PruningSpec& spec) {
  std::vector<GroupRule> rules;
  Overrides overrides(spec);
  for (const DependencyGroup& group : groups.groups) {
    std::vector<std::string> producers;
    for (int layer : group.layers) producers.push_back(model.nodes()[layer].layer->name());
    const OverrideRule rule = overrides.For(producers);
    rules.push_back(
        {rule.target, rule.excluded_by < 0
                          ? ""
                          : absl::StrCat("excluded by pruning.overrides[", rule.excluded_by, "]")});
  }
  if (const int i = overrides.unused(); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pruning.overrides[%d].layer: '%s' matches no convolution or linear "
                        "layer that makes channels in %s",
                        i, spec.overrides(i).layer(), model.arch()));
  }
  return rules;
}

// The count a group keeps when the schedule asks for `want`: rounded up to round_to, at least
// min_channels, at most what it has.
int Keep(const PruningSpec& spec, int want, int now) {
  int keep = want;
  if (spec.round_to() > 1) keep = (keep + spec.round_to() - 1) / spec.round_to() * spec.round_to();
  keep = std::max(keep, std::max(1, spec.min_channels()));
  return std::min(keep, now);
}

// The group's classes, lowest score first (ties: lower class index first, so choices repeat).
std::vector<int> ByScore(const std::vector<int>& classes, const std::vector<double>& key) {
  std::vector<int> order = classes;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] < key[b]; });
  return order;
}

}  // namespace

absl::StatusOr<std::vector<double>> ChannelScores(const Model& model, const ChannelGroups& groups,
                                                  PruningSpec::Score score,
                                                  const GradientStats* gradients) {
  std::vector<Moments> weights(groups.classes.size()), gammas(groups.classes.size());
  std::map<int, std::vector<float>> host;  // each producer's kernel, copied once
  for (size_t k = 0; k < groups.classes.size(); ++k) {
    for (const ChannelRow& row : groups.classes[k].rows) {
      const Parameter* kernel = model.nodes()[row.layer].layer->parameter(ParamRole::kKernel);
      auto [at, fresh] = host.try_emplace(row.layer);
      if (fresh) at->second = kernel->value.ToHost();
      const std::vector<float>& w = at->second;
      const size_t n = w.size() / kernel->value.shape()[0];
      const std::vector<float>* g = nullptr;
      if (score == PruningSpec::GRAD_L2) {
        auto it =
            gradients ? gradients->find(kernel->full_name()) : GradientStats::const_iterator{};
        if (!gradients || it == gradients->end() || it->second.size() != w.size()) {
          return absl::FailedPreconditionError(
              absl::StrCat(kernel->full_name(), ": GRAD_L2 scores need gradient statistics"));
        }
        g = &it->second;
      }
      for (size_t i = row.channel * n; i < (row.channel + 1) * n; ++i) {
        const double x = w[i];
        weights[k].Add(score == PruningSpec::L2         ? x * x
                       : score == PruningSpec::GRAD_L2  ? (*g)[i] * x * x
                       : score == PruningSpec::VARIANCE ? x
                                                        : std::fabs(x));
      }
    }
  }
  if (score == PruningSpec::BN_SCALE) {
    for (const Model::Node& node : model.nodes()) {
      if (node.layer->kind() != LayerKind::kBatchNorm) continue;
      const std::vector<float> gamma = node.layer->parameter(ParamRole::kGamma)->value.ToHost();
      const std::vector<int>& classes = groups.value_classes[node.output];
      for (size_t c = 0; c < classes.size(); ++c) {
        if (classes[c] >= 0) gammas[classes[c]].Add(std::fabs(gamma[c]));
      }
    }
  }
  std::vector<double> out(groups.classes.size());
  for (size_t k = 0; k < out.size(); ++k) {
    out[k] = score == PruningSpec::VARIANCE                          ? weights[k].variance()
             : score == PruningSpec::BN_SCALE && gammas[k].count > 0 ? gammas[k].mean()
                                                                     : weights[k].mean();
  }
  return out;
}

absl::StatusOr<ChannelChoice> ChooseChannels(const Model& model, const ChannelGroups& groups,
                                             const PruningSpec& spec, int round,
                                             const GradientStats* gradients) {
  TOPIARY_ASSIGN_OR_RETURN(const std::vector<GroupRule> rules, GroupRules(model, groups, spec));
  TOPIARY_ASSIGN_OR_RETURN(const std::vector<double> scores,
                           ChannelScores(model, groups, spec.score(), gradients));
  ChannelChoice choice;
  choice.remove.assign(groups.classes.size(), false);
  choice.macs_before = MultiplyAdds(model);
  choice.dense_macs = DenseMultiplyAdds(model);
  const std::vector<int64_t> saved = ClassMultiplyAdds(model, groups);

  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const DependencyGroup& group = groups.groups[g];
    ChannelGroupChoice& c = choice.groups.emplace_back();
    c.group = group.name;
    c.before = c.after = static_cast<int>(group.classes.size());
    c.original = std::max(c.before, model.original_out_channels(group.name));
    c.whole = !group.fixed.empty() ? group.fixed : rules[g].excluded;
    c.target = c.before;
  }
  if (spec.target_flops() == 0) {
    // Per group: the schedule's share of the group's target.
    for (size_t g = 0; g < groups.groups.size(); ++g) {
      ChannelGroupChoice& c = choice.groups[g];
      if (!c.whole.empty()) continue;
      const double frac = rules[g].target * Progress(spec, round);
      c.target = static_cast<int>(std::ceil((1 - frac) * c.original - 1e-9));
      c.after = Keep(spec, c.target, c.before);
      const std::vector<int> order = ByScore(groups.groups[g].classes, scores);
      for (int i = 0; i < c.before - c.after; ++i) choice.remove[order[i]] = true;
    }
  } else {
    // Across groups: lowest score per multiply-add saved. Scores are taken relative to their
    // group's mean (a layer's weight scale is arbitrary under batch norm) and savings relative
    // to the mean candidate's, so that both are comparable across groups. Costly channels
    // (high resolution, wide readers) go first, which is what makes the smaller network fast
    // and not only small; max_fraction stops a cheap group from being emptied (docs/
    // algorithms.md section 3a has the measurements behind both).
    const double goal = choice.dense_macs * (1 - (1 - spec.target_flops()) * Progress(spec, round));
    const double max_fraction = spec.max_fraction() > 0 ? spec.max_fraction() : 1;
    std::vector<double> priority(groups.classes.size(), 0);  // first: score / group mean
    std::vector<int> candidates, group_of(groups.classes.size(), -1);
    double mean_saved = 0;
    for (size_t g = 0; g < groups.groups.size(); ++g) {
      if (!choice.groups[g].whole.empty()) continue;
      const auto& classes = groups.groups[g].classes;
      double mean = 0;
      for (int k : classes) mean += scores[k] / classes.size();
      for (int k : classes) {
        priority[k] = mean > 0 ? scores[k] / mean : 0;
        group_of[k] = static_cast<int>(g);
        candidates.push_back(k);
        mean_saved += static_cast<double>(saved[k]);
      }
    }
    if (!candidates.empty()) mean_saved /= static_cast<double>(candidates.size());
    for (int k : candidates) {
      if (saved[k] > 0) priority[k] *= mean_saved / static_cast<double>(saved[k]);
    }
    // Each class's own saving keeps a running estimate (a product between two removed classes
    // counts twice, so it runs low); the exact count, taken when the estimate reaches the
    // goal, decides when the search ends.
    double estimate = static_cast<double>(choice.macs_before);
    for (int k : ByScore(candidates, priority)) {
      if (estimate <= goal) {
        estimate = static_cast<double>(MultiplyAdds(model, groups, choice.remove));
        if (estimate <= goal) break;
      }
      ChannelGroupChoice& c = choice.groups[group_of[k]];
      const int floor =
          std::max(std::max(1, spec.min_channels()),
                   static_cast<int>(std::ceil((1 - max_fraction) * c.original - 1e-9)));
      if (c.after <= floor) continue;
      choice.remove[k] = true;
      --c.after;
      estimate -= saved[k];
    }
    // round_to: each group takes back its best removed channels up to the next multiple.
    for (size_t g = 0; g < groups.groups.size(); ++g) {
      ChannelGroupChoice& c = choice.groups[g];
      c.target = c.after;
      const int keep = Keep(spec, c.after, c.before);
      const std::vector<int> order = ByScore(groups.groups[g].classes, scores);
      for (auto it = order.rbegin(); it != order.rend() && c.after < keep; ++it) {
        if (!choice.remove[*it]) continue;
        choice.remove[*it] = false;
        ++c.after;
      }
    }
    const double macs = static_cast<double>(MultiplyAdds(model, groups, choice.remove));
    if (macs > goal && Progress(spec, round) >= 1 && spec.round_to() <= 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pruning.target_flops: %.3g of the dense network's multiply-adds cannot be reached; "
          "with every group at its floor (min_channels %d, max_fraction %.3g, and the groups "
          "that keep every channel) %.3g remain",
          spec.target_flops(), spec.min_channels(), max_fraction, macs / choice.dense_macs));
    }
  }
  choice.macs_after = MultiplyAdds(model, groups, choice.remove);
  return choice;
}

}  // namespace topiary::pruning
