// Keeping data-parallel ranks identical. Rank 0's model is the run's: it is initialized or
// loaded, pruned, evaluated and checkpointed; the other ranks copy its state after each of
// those changes, and before a checkpoint is written every rank is compared with it.
#ifndef TOPIARY_TRAINER_DIST_REPLICATE_H_
#define TOPIARY_TRAINER_DIST_REPLICATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/nn/model.h"

namespace topiary {

// Copies every parameter's value (running statistics included), momentum and mask (with
// its description; installed only where it differs, so block-sparse plans are kept) from
// `from` to `to`. Errors: the models differ in their parameters.
absl::Status CopyModelState(const Model& from, Model* to);

// The first trainable parameter whose value, momentum or mask differs bit for bit between
// the two models (e.g. "stage1.block0.conv1.kernel: mask"), or "" when none does. Running
// statistics are each rank's own and are not compared.
absl::StatusOr<std::string> FirstDifference(const Model& a, const Model& b);

// For models in separate processes: three checksums per trainable parameter (value, momentum,
// mask with its description), in parameter order; and the part FirstDifference would name for
// the first checksum where `b` differs from `a` ("" when none does).
std::vector<uint64_t> StateChecksums(const Model& model);
std::string FirstChecksumDifference(const Model& model, const std::vector<uint64_t>& a,
                                    const std::vector<uint64_t>& b);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_REPLICATE_H_
