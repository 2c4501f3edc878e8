#include "pruning/channel_pruner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pruning/channel_select.h"
#include "util/status_macros.h"

namespace topiary::pruning {
namespace {

class ChannelPruner : public Pruner {
 public:
  // finished: the schedule's end removes nothing more; unmet: why the network is nonetheless
  // above the FLOPs target (empty: it is not, or there is none).
  ChannelPruner(const topiary::v1::PruningSpec& spec, Model* model, ChannelGroups groups,
                bool finished, std::string unmet)
      : spec_(spec),
        model_(model),
        groups_(std::move(groups)),
        finished_(finished),
        unmet_(std::move(unmet)) {}

  bool needs_gradients() const override {
    return spec_.score() == topiary::v1::PruningSpec::GRAD_L2;
  }

  absl::StatusOr<std::vector<LayerPruneReport>> Step(int round,
                                                     const GradientStats* gradients) override {
    TOPIARY_ASSIGN_OR_RETURN(ChannelChoice choice,
                             ChooseChannels(*model_, groups_, spec_, round, gradients));
    // At the schedule's end every group is at its final width: no later step changes anything.
    // A FLOPs target instead goes on while steps still remove channels (round_to may have
    // given some back), until the target or the floors.
    const bool end = round * static_cast<double>(spec_.step_fraction()) >= 1;
    std::vector<LayerPruneReport> reports;
    reports_.clear();
    bool removed = false;
    for (const ChannelGroupChoice& g : choice.groups) {
      topiary::v1::ChannelGroupReport& r = reports_.emplace_back();
      r.set_group(g.group);
      r.set_original(g.original);
      r.set_before(g.before);
      r.set_after(g.after);
      r.set_target(g.target);
      r.set_whole(g.whole);
      if (!g.whole.empty()) continue;
      // In the round table's terms: units are the group's original channels, zeros the
      // channels removed so far; the schedule asked for `requested`, the rules (round_to,
      // min_channels) allowed `target`; a group whose rules held it back stalled.
      LayerPruneReport& l = reports.emplace_back();
      l.layer = g.group;
      l.units = g.original;
      l.zeros_before = g.original - g.before;
      l.zeros_after = g.original - g.after;
      l.requested_zeros = g.original - g.target;
      l.target_zeros = g.original - g.after;
      l.reached = end;
      l.stalled = g.after == g.before && g.after > g.target;
      removed = removed || g.after < g.before;
    }
    finished_ = finished_ || (end && (spec_.target_flops() == 0 || !removed));
    cut_ = ChannelCut{groups_, std::move(choice.remove)};
    if (!removed) cut_.reset();
    return reports;
  }

  bool finished() const override { return finished_; }
  std::string unmet_target() const override { return finished_ ? unmet_ : ""; }

  std::vector<std::string> dense_layers() const override {
    std::vector<std::string> whole;
    for (const DependencyGroup& g : groups_.groups) {
      if (!g.fixed.empty()) whole.push_back(absl::StrCat(g.name, ": ", g.fixed));
    }
    return whole;
  }

  std::optional<ChannelCut> TakeChannelCut() override { return std::exchange(cut_, std::nullopt); }

  std::vector<topiary::v1::ChannelGroupReport> channel_groups() const override { return reports_; }

 private:
  const topiary::v1::PruningSpec spec_;
  Model* model_;
  ChannelGroups groups_;
  bool finished_;
  std::string unmet_;
  std::optional<ChannelCut> cut_;
  std::vector<topiary::v1::ChannelGroupReport> reports_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Pruner>> MakeChannelPruner(const topiary::v1::PruningSpec& spec,
                                                          Model* model) {
  TOPIARY_ASSIGN_OR_RETURN(ChannelGroups groups, FindChannelGroups(*model));
  bool any = false;
  for (const DependencyGroup& g : groups.groups) any = any || g.fixed.empty();
  if (!any) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pruning: no channel of ", model->arch(),
        " can be removed (every dependency group is fixed: the logits, grouped convolutions)"));
  }
  // The schedule's end, now: overrides and a FLOPs target the floors cannot meet are refused
  // before the first round, and a network already at its final widths (a resumed or
  // compacted run's) is finished. GRAD_L2 needs gradients, which only a step has: L1 stands in
  // (with round_to and a FLOPs target, which channels go can change whether any go).
  topiary::v1::PruningSpec final_step = spec;
  if (spec.score() == topiary::v1::PruningSpec::GRAD_L2) {
    final_step.set_score(topiary::v1::PruningSpec::L1);
  }
  const int last_round = static_cast<int>(std::ceil(1.0 / spec.step_fraction()));
  TOPIARY_ASSIGN_OR_RETURN(ChannelChoice end,
                           ChooseChannels(*model, groups, final_step, last_round, nullptr));
  const bool finished = std::find(end.remove.begin(), end.remove.end(), true) == end.remove.end();
  std::string unmet;
  if (spec.target_flops() > 0 &&
      end.macs_after > static_cast<double>(spec.target_flops()) * end.dense_macs) {
    unmet = absl::StrFormat(
        "target_flops %.3g not reached: round_to %d, min_channels %d and max_fraction %.3g "
        "keep %.1f%% of the dense multiply-adds",
        spec.target_flops(), spec.round_to(), spec.min_channels(), spec.max_fraction(),
        100.0 * end.macs_after / end.dense_macs);
  }
  return std::unique_ptr<Pruner>(
      new ChannelPruner(spec, model, std::move(groups), finished, std::move(unmet)));
}

}  // namespace topiary::pruning
