// Backward data at stride > 1 as stride_h x stride_w unit-stride problems, one per phase.
//
// dx[h] = sum over taps r with (h + pad - r) divisible by the stride of dy[(h + pad - r) /
// stride] w[r]. The rows h of one residue ph (h = ph + stride * i) all take the same taps, r =
// r0 + stride * t with r0 = (ph + pad) mod stride, and read dy[i + d - t] with d = (ph + pad -
// r0) / stride: a unit-stride backward-data problem over i with the sub-filter w'[t] = w[r0 +
// stride * t] and lower padding d. Its dx rows are every stride-th row of dx and its filter taps
// every stride-th tap of w: strided views of the same tensors, which TMA reads and writes
// directly (hopper_conv.h), so no data is copied. The same holds for columns.
//
// A phase with no taps (a 1x1 filter at stride 2 reaches only the even rows) has dx = 0 there.
#ifndef TOPIARY_KERNELS_SPARSE_DGRAD_PHASES_H_
#define TOPIARY_KERNELS_SPARSE_DGRAD_PHASES_H_

#include <vector>

#include "kernels/conv/conv.h"

namespace topiary::kernels {

struct DgradPhase {
  int ph = 0, pw = 0;  // dx rows ph, ph + stride_h, ...; columns likewise
  int r0 = 0, s0 = 0;  // the first tap of each filter side; then every stride-th
  // The unit-stride problem: h, w the phase's dx rows and columns, r, s its taps (0: none, dx is
  // 0 in this phase), pad_h, pad_w the lower padding d; n, c, k as the layer's.
  ConvShape shape;
  // The upper padding that gives the problem the layer's dy extent (Ho = h + pad_h + pad_h_hi
  // - r + 1); negative where the phase's last dy rows reach no dx row of it.
  int pad_h_hi = 0, pad_w_hi = 0;
  bool empty() const { return shape.r == 0 || shape.s == 0 || shape.h == 0 || shape.w == 0; }
};

// The stride_h * stride_w phases of backward data on `shape`, rows' residue outer.
// REQUIRES: CheckConvShape(shape).ok().
std::vector<DgradPhase> DgradPhases(const ConvShape& shape);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_DGRAD_PHASES_H_
