// Synchronized batch norm (device { sync_batch_norm: true }): each batch-norm layer's
// per-channel sums (CPU ranks) or moments (GPU ranks) go through the run's collective, so every
// rank normalizes with the statistics of the whole global batch, as one rank holding it would.
#ifndef TOPIARY_TRAINER_DIST_BATCH_NORM_SYNC_H_
#define TOPIARY_TRAINER_DIST_BATCH_NORM_SYNC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/norm_pool/batch_norm.h"
#include "trainer/dist/collective.h"
#include "trainer/nn/model.h"

namespace topiary {

// Rank `rank`'s end of the collective, with room for CPU batch norms of up to `channels`
// channels (allocated here, so no pass allocates; GPU layers gather in their workspace).
std::unique_ptr<kernels::BatchNormSync> MakeBatchNormSync(Collective* collective, int rank,
                                                          size_t channels);

// The channels of the model's widest batch norm (0: none).
size_t WidestBatchNorm(const Model& model);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_BATCH_NORM_SYNC_H_
