// The rows of a run's round table (RoundSummary): every masked kernel's sparsity, its
// mask, the prune step's targets and the measured dispatch of its block-sparse passes; and
// the note a run leaves when its rounds end short of the pruning target.
#ifndef TOPIARY_TRAINER_RUN_ROUND_REPORT_H_
#define TOPIARY_TRAINER_RUN_ROUND_REPORT_H_

#include <string>
#include <utility>
#include <vector>

#include "topiary/v1/events.pb.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/nn/model.h"
#include "trainer/run/pruner_interface.h"

namespace topiary {

using SparseConvChoices = std::vector<std::pair<std::string, SparseConvChoice>>;

// Sparsity of every conv and linear kernel of `model` after round `round`; `reports` (may be
// null) adds the prune step's targets and flags, `choices` the training network's dispatch.
topiary::v1::RoundSummary SparsityRow(const Model& model, const SparseConvChoices& choices,
                                      int round, const std::vector<LayerPruneReport>* reports);

// Why the rounds ended short of pruning.target (`why`) and which layers fell short of
// theirs: `last` is the last round's row, `now` the model's row as it is.
std::string TargetNote(const topiary::v1::PruningSpec& pruning,
                       const topiary::v1::RoundSummary& last, const topiary::v1::RoundSummary& now,
                       int rounds, const std::string& why);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_ROUND_REPORT_H_
