// Chan et al.'s merge of two (count, mean, M2) summaries of a set of values (M2: the sum of
// squared deviations from the mean), the one rule by which the batch norm's reductions
// (kernels/norm_pool) and the convolution epilogues that reduce for them
// (kernels/sparse/hopper_conv.h) combine partial statistics. On the host and in kernels.
#ifndef TOPIARY_KERNELS_RUNTIME_MOMENTS_H_
#define TOPIARY_KERNELS_RUNTIME_MOMENTS_H_

#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

// Merges (nb, meanb, m2b) into (n, mean, m2). An empty summary (count 0; its mean and M2 may be
// anything, even NaN) adds nothing, and an empty (n, mean, m2) takes the other whole.
template <typename F>
TOPIARY_HD inline void MergeMoments(F& n, F& mean, F& m2, F nb, F meanb, F m2b) {
  if (nb == F(0)) return;
  if (n == F(0)) {
    n = nb, mean = meanb, m2 = m2b;
    return;
  }
  const F total = n + nb;
  const F delta = meanb - mean;
  mean += delta * nb / total;
  m2 += m2b + delta * delta * n * nb / total;
  n = total;
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_MOMENTS_H_
