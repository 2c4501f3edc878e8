// Channel pruning's choice (PruningSpec method CHANNEL): which channel classes of a network's
// dependency groups (trainer/nn/channels.h) one round removes.
//
// Scores, per channel class (summed over the rows of every producer it has): L1 and L2 the
// mean |w| and w^2 of the producers' kernel rows, VARIANCE their variance, GRAD_L2 the mean of
// |dW| w^2 (first-order Taylor), BN_SCALE the mean |gamma| of the batch norms it passes (L1 where
// it passes none). Lowest scores go first.
//
// Schedule: round r of a group with target t removes the lowest-scored channels until the
// group keeps ceil((1 - t * min(1, r * step_fraction)) * original) of its original channels,
// that count rounded up to a multiple of round_to and never below min_channels (the rules a
// group cannot meet leave it above its target, and its report says so). With target_flops the
// channels are chosen across every group instead: by score relative to its group's mean,
// until the network's multiply-adds are at most
// (1 - (1 - target_flops) * min(1, r * step_fraction)) of the dense network's; round_to then
// gives each group back its best removed channels up to the next multiple (so the network may
// end a little above that share: the report gives the exact figure).
#ifndef TOPIARY_PRUNING_CHANNEL_SELECT_H_
#define TOPIARY_PRUNING_CHANNEL_SELECT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/nn/channels.h"
#include "trainer/nn/model.h"
#include "trainer/run/pruner_interface.h"

namespace topiary::pruning {

// What one round chose for one dependency group.
struct ChannelGroupChoice {
  std::string group;  // its first producer's name
  int original = 0;   // channels before any round
  int before = 0;     // channels now
  int after = 0;      // channels this round keeps
  int target = 0;     // what the schedule asks this round (before round_to and the floor)
  std::string whole;  // why it keeps every channel (a fixed group, an exclude); empty: pruned
};

struct ChannelChoice {
  std::vector<bool> remove;  // per class of the groups
  std::vector<ChannelGroupChoice> groups;
  int64_t dense_macs = 0;   // one image, before any round (this network's if never pruned)
  int64_t macs_before = 0;  // one image, now
  int64_t macs_after = 0;   // one image, after this round's compaction
};

// Per channel class of `groups`: its score (see above). `gradients` is needed for GRAD_L2.
absl::StatusOr<std::vector<double>> ChannelScores(const Model& model, const ChannelGroups& groups,
                                                  topiary::v1::PruningSpec::Score score,
                                                  const GradientStats* gradients);

// Round `round` (1-based) of `spec` (defaults filled in) on `model` (compacted by earlier
// rounds or not: widths and multiply-adds count from its original widths). Errors name the
// field: an override matching no producer, a FLOPs target the groups' floors cannot reach.
absl::StatusOr<ChannelChoice> ChooseChannels(const Model& model, const ChannelGroups& groups,
                                             const topiary::v1::PruningSpec& spec, int round,
                                             const GradientStats* gradients);

}  // namespace topiary::pruning

#endif  // TOPIARY_PRUNING_CHANNEL_SELECT_H_
