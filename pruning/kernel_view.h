// KernelView: a prunable kernel as it lies in memory, seen as [out, taps, in]: a conv kernel
// [K, R, S, C] has taps = R*S; a linear kernel [out, in] has taps = 1. Masks and scores are
// computed on host copies of the weights; pruning never touches device memory itself.
#ifndef TOPIARY_PRUNING_KERNEL_VIEW_H_
#define TOPIARY_PRUNING_KERNEL_VIEW_H_

#include <cstddef>
#include <cstdint>

namespace topiary::pruning {

struct KernelView {
  int out = 0, taps = 1, in = 0;
  const float* w = nullptr;         // out * taps * in weights
  const float* grad_abs = nullptr;  // optional: mean |dW| per weight (GRAD_L2 scores)
  const uint8_t* mask = nullptr;    // optional: current element mask (1 = kept); null = dense

  size_t size() const { return static_cast<size_t>(out) * taps * in; }
  size_t index(int k, int t, int c) const { return (static_cast<size_t>(k) * taps + t) * in + c; }
  bool kept(size_t i) const { return mask == nullptr || mask[i] != 0; }
};

}  // namespace topiary::pruning

#endif  // TOPIARY_PRUNING_KERNEL_VIEW_H_
