// Pruner: the interface through which the experiment runner drives pruning rounds. The
// policies themselves (block masks, magnitude, N:M) live in pruning/, which depends on the
// trainer, not the other way round: whoever starts a run (the CLI, the daemon) passes a
// PrunerFactory in RunOptions.
//
// The runner makes one pruner for a run's rounds (again only when a manual round changes the
// spec). Its decisions come from the spec, the model and the masks installed on the model's
// parameters, so a resumed run continues with the same ones; the one thing it remembers,
// which layers' last step stalled, a resumed run's pruner learns again in one step.
#ifndef TOPIARY_TRAINER_RUN_PRUNER_INTERFACE_H_
#define TOPIARY_TRAINER_RUN_PRUNER_INTERFACE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/events.pb.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/nn/channels.h"
#include "trainer/nn/model.h"

namespace topiary {

// What one prune step did to one layer. Units are blocks for block masks, weights otherwise.
struct LayerPruneReport {
  std::string layer;
  int64_t units = 0;
  int64_t zeros_before = 0, zeros_after = 0, target_zeros = 0;
  // floor(target * units): above target_zeros when the block rules make it unreachable.
  int64_t requested_zeros = 0;
  bool fallback = false;  // block masks: the per-column fallback ran
  bool reached = false;   // the layer is at its target
  bool stalled = false;   // this step could add no zeros (the constraints allow no more)
};

// Mean |dW| per weight of each kernel (memory layout), keyed by Parameter::full_name().
using GradientStats = std::map<std::string, std::vector<float>>;

class Pruner {
 public:
  virtual ~Pruner() = default;
  // True when scores need gradient statistics (GRAD_L2).
  virtual bool needs_gradients() const = 0;
  // One prune step (round `round`, 1-based): updates masks on the model's parameters and
  // zeroes what they mask. `gradients` is set when needs_gradients().
  virtual absl::StatusOr<std::vector<LayerPruneReport>> Step(int round,
                                                             const GradientStats* gradients) = 0;
  // True when no further step can change anything: every eligible layer has reached its
  // target or stalled in the last step.
  virtual bool finished() const = 0;
  // When finished() although the spec's target is not met (channel pruning's round_to and
  // min_channels may leave more multiply-adds than target_flops asks): why, in a sentence;
  // empty otherwise.
  virtual std::string unmet_target() const { return ""; }
  // The conv and linear layers this spec leaves dense, each with why.
  virtual std::vector<std::string> dense_layers() const { return {}; }
  // Channel pruning: the channels the last Step chose, which the runner removes from every
  // rank's network (CompactModel) before fine-tuning; then it makes a new pruner for the
  // smaller network. nullopt: the step only installed masks.
  virtual std::optional<ChannelCut> TakeChannelCut() { return std::nullopt; }
  // Method CHANNEL: each group's widths in the last Step.
  virtual std::vector<topiary::v1::ChannelGroupReport> channel_groups() const { return {}; }
};

using PrunerFactory = std::function<absl::StatusOr<std::unique_ptr<Pruner>>(
    const topiary::v1::PruningSpec& spec, Model* model, uint64_t seed)>;

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_PRUNER_INTERFACE_H_
