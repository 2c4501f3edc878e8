// Installing masks on parameters and measuring sparsity. Masks are enforced by projection in
// the optimizer (see parameter.h); installing one also zeroes the weights and momentum it
// masks, so the next forward pass already sees the pruned model.
#ifndef TOPIARY_TRAINER_NN_MASKS_H_
#define TOPIARY_TRAINER_NN_MASKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "trainer/core/parameter.h"

namespace topiary {

// Sets p's element mask (1 = kept, p->size() entries, memory layout) and its description,
// and (zero_masked) zeroes p's value and momentum under it; pass false only when they are
// zero there already. Allocates the mask on p's device the first time (so a captured CUDA
// graph that read no mask must be captured again). Errors: size mismatch (names the
// parameter), allocation.
absl::Status InstallMask(Parameter* p, const std::vector<uint8_t>& mask, MaskInfo info,
                         bool zero_masked = true);

// The element mask on the host (all ones when p is dense).
std::vector<uint8_t> HostMask(const Parameter& p);

// Masked entries of p (0 when dense).
int64_t MaskedCount(const Parameter& p);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_MASKS_H_
