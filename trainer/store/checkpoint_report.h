// Sparsity reports of masked checkpoints: per-layer shape, mask kind, block occupancy,
// sparsity and weight statistics, with the checkpoint's provenance and metrics. Used by
// `topiary inspect --file` (and the daemon's InspectCheckpoint).
#ifndef TOPIARY_TRAINER_STORE_CHECKPOINT_REPORT_H_
#define TOPIARY_TRAINER_STORE_CHECKPOINT_REPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "topiary/v1/checkpoint.pb.h"

namespace topiary {

// Reads `path` (checked like any checkpoint load) and reports the conv and linear kernels
// whose layer name matches `layer_pattern` (glob; empty: all). When exactly one layer
// matches, its block grid is included. Errors: the file's, or a pattern matching nothing.
absl::StatusOr<topiary::v1::CheckpointReport> InspectCheckpoint(const std::string& path,
                                                                const std::string& layer_pattern);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_STORE_CHECKPOINT_REPORT_H_
