// Channel pruning (PruningSpec method CHANNEL) as a trainer Pruner: each Step chooses the
// round's channels (pruning/channel_select.h) and hands them to the runner as a ChannelCut,
// which removes them from every rank's network before the round's fine-tuning. A pruner
// serves one network: the runner makes a new one for the compacted network.
#ifndef TOPIARY_PRUNING_CHANNEL_PRUNER_H_
#define TOPIARY_PRUNING_CHANNEL_PRUNER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/nn/model.h"
#include "trainer/run/pruner_interface.h"

namespace topiary::pruning {

// Errors name the field (an override matching no producer, a FLOPs target the floors cannot
// meet: both before the first round) or say that no group of the network can lose a channel.
absl::StatusOr<std::unique_ptr<Pruner>> MakeChannelPruner(const topiary::v1::PruningSpec& spec,
                                                          Model* model);

}  // namespace topiary::pruning

#endif  // TOPIARY_PRUNING_CHANNEL_PRUNER_H_
