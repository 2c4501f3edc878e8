#include "pruning/pruner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pruning/block_mask.h"
#include "pruning/channel_pruner.h"
#include "pruning/element_mask.h"
#include "pruning/overrides.h"
#include "trainer/nn/masks.h"

namespace topiary::pruning {
namespace {

using topiary::v1::PruningSpec;

// One prunable kernel and what the spec asks of it.
struct Target {
  Parameter* kernel = nullptr;
  int out = 0, taps = 1, in = 0;
  double target = 0;
  bool stalled = false;  // the last step could add no zeros
};

class SpecPruner : public Pruner {
 public:
  SpecPruner(const PruningSpec& spec, std::vector<Target> targets, uint64_t seed,
             std::vector<std::string> dense)
      : spec_(spec), targets_(std::move(targets)), seed_(seed), dense_(std::move(dense)) {}

  std::vector<std::string> dense_layers() const override { return dense_; }

  bool needs_gradients() const override {
    return spec_.method() == PruningSpec::BLOCK && spec_.score() == PruningSpec::GRAD_L2;
  }

  absl::StatusOr<std::vector<LayerPruneReport>> Step(int round,
                                                     const GradientStats* gradients) override {
    switch (spec_.method()) {
      case PruningSpec::BLOCK:
        return BlockStep(round, gradients);
      case PruningSpec::N_OF_M:
        return NofMStep();
      default:
        return MagnitudeStep();
    }
  }

  bool finished() const override {
    if (spec_.method() == PruningSpec::MAGNITUDE && spec_.global()) {
      int64_t units = 0, zeros = 0;
      for (const Target& t : targets_) {
        units += Units(t);
        zeros += Zeros(t);
      }
      return targets_[0].stalled ||
             zeros >= static_cast<int64_t>(std::floor(spec_.target() * units));
    }
    for (const Target& t : targets_) {
      if (!t.stalled && !Reached(t)) return false;
    }
    return true;
  }

 private:
  KernelView View(const Target& t, const std::vector<float>& w) const {
    KernelView v;
    v.out = t.out;
    v.taps = t.taps;
    v.in = t.in;
    v.w = w.data();
    return v;
  }

  BlockGrid GridOf(const Target& t) const {
    const MaskInfo& info = t.kernel->mask_info;
    if (info.kind == MaskInfo::Kind::kBlock) {
      BlockGrid g = info.blocks;
      return g;
    }
    return BlockGrid::Dense(t.in, t.out, spec_.block_in(), spec_.block_out());
  }

  int64_t Units(const Target& t) const {
    if (spec_.method() != PruningSpec::BLOCK) return static_cast<int64_t>(t.kernel->size());
    const BlockGrid g = GridOf(t);
    return static_cast<int64_t>(g.rows) * g.cols;
  }
  int64_t Zeros(const Target& t) const {
    if (spec_.method() == PruningSpec::BLOCK) return GridOf(t).zeros();
    return MaskedCount(*t.kernel);
  }
  // Block layers: the reachable bound (ReachableBlockZeros), so a layer whose target the
  // column cap and row rule forbid finishes at that bound instead of stepping in vain.
  int64_t TargetZeros(const Target& t) const {
    if (spec_.method() == PruningSpec::BLOCK) {
      const BlockGrid g = GridOf(t);
      return ReachableBlockZeros(g.rows, g.cols, t.target);
    }
    if (spec_.method() == PruningSpec::N_OF_M) {
      return static_cast<int64_t>(t.kernel->size()) / spec_.m() * (spec_.m() - spec_.n());
    }
    return static_cast<int64_t>(std::floor(t.target * Units(t)));
  }
  bool Reached(const Target& t) const { return Zeros(t) >= TargetZeros(t); }

  LayerPruneReport Report(const Target& t, int64_t before) const {
    LayerPruneReport r;
    r.layer = t.kernel->layer;
    r.units = Units(t);
    r.zeros_before = before;
    r.zeros_after = Zeros(t);
    r.target_zeros = TargetZeros(t);
    r.requested_zeros = static_cast<int64_t>(std::floor(t.target * Units(t)));
    r.reached = r.zeros_after >= r.target_zeros;
    r.stalled = t.stalled;
    return r;
  }

  absl::StatusOr<std::vector<LayerPruneReport>> BlockStep(int round,
                                                          const GradientStats* gradients) {
    std::vector<LayerPruneReport> reports;
    for (size_t i = 0; i < targets_.size(); ++i) {
      Target& t = targets_[i];
      const std::vector<float> w = t.kernel->value.ToHost();
      const std::vector<uint8_t> mask = HostMask(*t.kernel);
      KernelView view = View(t, w);
      view.mask = mask.data();
      if (spec_.score() == PruningSpec::GRAD_L2) {
        auto g =
            gradients ? gradients->find(t.kernel->full_name()) : GradientStats::const_iterator();
        if (gradients == nullptr || g == gradients->end()) {
          return absl::InternalError(
              absl::StrCat(t.kernel->full_name(), ": GRAD_L2 scores need gradient statistics"));
        }
        view.grad_abs = g->second.data();
      }
      BlockGrid grid = GridOf(t);
      const std::vector<double> scores = BlockScores(view, grid, spec_.score());
      // One fallback order per (seed, round, layer).
      const uint64_t step_seed = seed_ ^ (static_cast<uint64_t>(round) << 40) ^ (i << 20);
      const BlockStepReport step = BlockPruneStep(scores, t.target, spec_.step_fraction(),
                                                  step_seed, &grid, spec_.balanced());
      t.stalled = step.zeros_after == step.zeros_before && step.zeros_after < step.target_zeros;
      MaskInfo info;
      info.kind = MaskInfo::Kind::kBlock;
      info.blocks = grid;
      auto st = InstallMask(t.kernel, grid.Expand(t.out, t.taps, t.in), std::move(info));
      if (!st.ok()) return st;
      LayerPruneReport r = Report(t, step.zeros_before);
      r.fallback = step.fallback;
      reports.push_back(r);
    }
    return reports;
  }

  absl::StatusOr<std::vector<LayerPruneReport>> MagnitudeStep() {
    std::vector<std::vector<float>> weights(targets_.size());
    std::vector<std::vector<uint8_t>> masks(targets_.size());
    std::vector<int64_t> before(targets_.size());
    for (size_t i = 0; i < targets_.size(); ++i) {
      weights[i] = targets_[i].kernel->value.ToHost();
      masks[i] = HostMask(*targets_[i].kernel);
      before[i] = MaskedCount(*targets_[i].kernel);
    }
    // Each layer's (or, with global, all layers') zeros grow by step_fraction of the target
    // per round until the target: the same schedule as block masks.
    auto new_zeros = [&](int64_t units, int64_t zeros, double target) {
      const int64_t goal = static_cast<int64_t>(std::floor(target * units));
      const int64_t k =
          std::max<int64_t>(1, static_cast<int64_t>(std::floor(spec_.step_fraction() * goal)));
      return std::max<int64_t>(0, std::min(zeros + k, goal) - zeros);
    };
    if (spec_.global()) {
      std::vector<MaskedKernel> all;
      int64_t units = 0, zeros = 0;
      for (size_t i = 0; i < targets_.size(); ++i) {
        all.push_back({View(targets_[i], weights[i]), &masks[i]});
        units += static_cast<int64_t>(weights[i].size());
        zeros += before[i];
      }
      const int64_t added = ZeroSmallestMagnitudes(all, new_zeros(units, zeros, spec_.target()));
      for (Target& t : targets_) t.stalled = added == 0;
    } else {
      for (size_t i = 0; i < targets_.size(); ++i) {
        Target& t = targets_[i];
        const int64_t want =
            new_zeros(static_cast<int64_t>(weights[i].size()), before[i], t.target);
        t.stalled =
            want > 0 && ZeroSmallestMagnitudes({{View(t, weights[i]), &masks[i]}}, want) == 0;
      }
    }
    std::vector<LayerPruneReport> reports;
    for (size_t i = 0; i < targets_.size(); ++i) {
      MaskInfo info;
      info.kind = MaskInfo::Kind::kElement;
      auto st = InstallMask(targets_[i].kernel, masks[i], std::move(info));
      if (!st.ok()) return st;
      reports.push_back(Report(targets_[i], before[i]));
    }
    return reports;
  }

  absl::StatusOr<std::vector<LayerPruneReport>> NofMStep() {
    std::vector<LayerPruneReport> reports;
    for (Target& t : targets_) {
      const std::vector<float> w = t.kernel->value.ToHost();
      std::vector<uint8_t> mask = HostMask(*t.kernel);
      const int64_t before = MaskedCount(*t.kernel);
      ApplyNofM(View(t, w), spec_.n(), spec_.m(), &mask);
      MaskInfo info;
      info.kind = MaskInfo::Kind::kNofM;
      info.n = spec_.n();
      info.m = spec_.m();
      auto st = InstallMask(t.kernel, mask, std::move(info));
      if (!st.ok()) return st;
      reports.push_back(Report(t, before));
    }
    return reports;
  }

  PruningSpec spec_;
  std::vector<Target> targets_;
  uint64_t seed_;
  std::vector<std::string> dense_;  // layers left dense, with why
};

const char* MethodName(PruningSpec::Method m) { return PruningSpec::Method_Name(m).c_str(); }

}  // namespace

absl::StatusOr<std::unique_ptr<Pruner>> MakePruner(const PruningSpec& spec, Model* model,
                                                   uint64_t seed) {
  if (spec.method() == PruningSpec::CHANNEL) return MakeChannelPruner(spec, model);
  Overrides overrides(spec);
  std::vector<Target> targets;
  std::vector<std::string> names, dense;
  for (const Model::Node& node : model->nodes()) {
    Layer* layer = node.layer;
    if (layer->kind() != LayerKind::kConv2d && layer->kind() != LayerKind::kLinear) continue;
    names.push_back(layer->name());
    Parameter* kernel = layer->parameter(ParamRole::kKernel);
    if (kernel == nullptr) continue;
    Target t;
    t.kernel = kernel;
    const std::vector<int>& shape = kernel->value.shape();  // [K, R, S, C] or [out, in]
    t.out = shape.front();
    t.in = shape.back();
    t.taps = shape.size() == 4 ? shape[1] * shape[2] : 1;
    const OverrideRule rule = overrides.For({layer->name()});
    t.target = rule.target;
    if (rule.excluded_by >= 0) {
      dense.push_back(layer->name() + ": excluded by pruning.overrides");
      continue;
    }
    std::string why;  // empty: eligible
    if (spec.method() == PruningSpec::BLOCK) {
      const BlockGrid g = BlockGrid::Dense(t.in, t.out, spec.block_in(), spec.block_out());
      if (layer->kind() != LayerKind::kConv2d) {
        why = "block masks prune convolutions only";
      } else if (g.rows < 2 || g.cols < 2) {
        // One block row: the row rule keeps it; one column: nothing to choose between.
        why = absl::StrFormat(
            "%d input x %d output channels make %d x %d blocks of %d x %d "
            "(at least 2 x 2 needed)",
            t.in, t.out, g.rows, g.cols, spec.block_in(), spec.block_out());
      }
    } else if (spec.method() == PruningSpec::N_OF_M && t.in % spec.m() != 0) {
      why = absl::StrFormat("%d input channels are not a multiple of m = %d", t.in, spec.m());
    }
    if (why.empty()) {
      targets.push_back(t);
    } else {
      dense.push_back(layer->name() + ": " + why);
    }
  }
  if (const int i = overrides.unused(); i >= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pruning.overrides[%d].layer: '%s' matches no conv or linear layer of %s (layers: %s)", i,
        spec.overrides(i).layer(), model->arch(), absl::StrJoin(names, ", ")));
  }
  if (targets.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pruning: no layer of %s is eligible for %s pruning%s", model->arch(),
        MethodName(spec.method()),
        spec.method() == PruningSpec::BLOCK
            ? absl::StrFormat(" with %dx%d blocks (a layer needs more than one input block and "
                              "more than one output block)",
                              spec.block_in(), spec.block_out())
            : ""));
  }
  return std::unique_ptr<Pruner>(new SpecPruner(spec, std::move(targets), seed, std::move(dense)));
}

}  // namespace topiary::pruning
