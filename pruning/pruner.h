// The pruning policies of the spec (BLOCK, MAGNITUDE, N_OF_M) as a trainer Pruner: which
// layers are eligible, each layer's target (overrides by layer-name pattern), and one prune
// step per round, installed as masks on the model's kernels.
//
// Eligibility: BLOCK prunes convolutions whose block grid has more than one row and more
// than one column (never a 1- or 3-channel stem); MAGNITUDE prunes every conv and linear
// kernel; N_OF_M those whose input channels are a multiple of m. An override whose pattern
// matches a layer sets its target or excludes it; when several match, the last one wins.
#ifndef TOPIARY_PRUNING_PRUNER_H_
#define TOPIARY_PRUNING_PRUNER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/nn/model.h"
#include "trainer/run/pruner_interface.h"

namespace topiary::pruning {

// Errors name the field: an override matching no layer, no eligible layer at all.
// `spec` has its defaults filled in (trainer/spec/spec.h WithDefaults).
absl::StatusOr<std::unique_ptr<Pruner>> MakePruner(const topiary::v1::PruningSpec& spec,
                                                   Model* model, uint64_t seed);

}  // namespace topiary::pruning

#endif  // TOPIARY_PRUNING_PRUNER_H_
