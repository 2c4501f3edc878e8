// Element masks: unstructured magnitude pruning (Han et al., arXiv:1506.02626), per layer or
// with one threshold over several layers, and N:M patterns along input channels (2:4 is the
// pattern sparse tensor cores execute). Masks are monotone: a zero stays zero.
#ifndef TOPIARY_PRUNING_ELEMENT_MASK_H_
#define TOPIARY_PRUNING_ELEMENT_MASK_H_

#include <cstdint>
#include <vector>

#include "pruning/kernel_view.h"

namespace topiary::pruning {

// A kernel and its element mask (1 = kept, same layout as the kernel), updated in place.
struct MaskedKernel {
  KernelView view;  // view.mask is ignored; `mask` is the current mask
  std::vector<uint8_t>* mask = nullptr;
};

// Zeroes the `count` kept weights with the smallest |w| over all `kernels` together (ties
// broken by kernel, then position, so the result is deterministic). Per-layer magnitude
// pruning passes one kernel. Returns the number zeroed (less when fewer weights are kept).
int64_t ZeroSmallestMagnitudes(const std::vector<MaskedKernel>& kernels, int64_t count);

// N:M along input channels: in every group of m consecutive input channels (for each output
// channel and filter tap) keeps at most the n largest |w| among the kept ones.
// REQUIRES: view.in % m == 0, 0 < n < m.
void ApplyNofM(const KernelView& view, int n, int m, std::vector<uint8_t>* mask);

// True when every group of m consecutive input channels has at most n kept non-zeros.
bool SatisfiesNofM(const KernelView& view, int n, int m, const std::vector<uint8_t>& mask);

}  // namespace topiary::pruning

#endif  // TOPIARY_PRUNING_ELEMENT_MASK_H_
