// A pruning spec's overrides applied to layers: each override's glob is matched against layer
// names, and the last matching override wins (its target, or its exclude). Shared by the mask
// pruners (one layer at a time) and channel pruning (a dependency group's producers at once).
#ifndef TOPIARY_PRUNING_OVERRIDES_H_
#define TOPIARY_PRUNING_OVERRIDES_H_

#include <string>
#include <vector>

#include "topiary/v1/experiment.pb.h"
#include "trainer/util/glob.h"

namespace topiary::pruning {

struct OverrideRule {
  double target = 0;
  int excluded_by = -1;  // the override that excludes the layers; -1: none
};

class Overrides {
 public:
  explicit Overrides(const topiary::v1::PruningSpec& spec)
      : spec_(spec), used_(spec.overrides_size(), false) {}

  // The rule for `layers` (one layer, or a group's producers): the spec's target, then every
  // override matching any of them, in order.
  OverrideRule For(const std::vector<std::string>& layers) {
    OverrideRule rule{spec_.target(), -1};
    for (int i = 0; i < spec_.overrides_size(); ++i) {
      const auto& o = spec_.overrides(i);
      bool match = false;
      for (const std::string& layer : layers) match = match || GlobMatch(o.layer(), layer);
      if (!match) continue;
      used_[i] = true;
      rule.excluded_by = o.exclude() ? i : -1;
      if (o.has_target()) rule.target = o.target();
    }
    return rule;
  }

  // The first override that matched no layer asked about so far; -1: none.
  int unused() const {
    for (size_t i = 0; i < used_.size(); ++i) {
      if (!used_[i]) return static_cast<int>(i);
    }
    return -1;
  }

 private:
  const topiary::v1::PruningSpec& spec_;
  std::vector<bool> used_;
};

}  // namespace topiary::pruning

#endif  // TOPIARY_PRUNING_OVERRIDES_H_
