// How well a multiplier serves one approximate layer: its error over the codes the layer's
// products actually use, beside the same measure over the whole table.
//
// A table's published metrics average over all 2^16 operand pairs. A layer uses few of them:
// in TFApprox's asymmetric mode a zero weight sits at a code near 128, so every product runs
// through the table far from 0 while the value it stands for, (a - zp_a)(c - zp_w), is small;
// an error of 1% of a * c can then be 20% of the real product. This measure catches that:
//
//   used  = E|T'[a, c] - a c| / E|(a - zp_a)(c - zp_w)|
//
// over the layer's activation codes a and weight codes c (their histograms on one batch, as
// independent draws), with T' the table the kernels read (the sign-magnitude table's error at
// (a, c) is the multiplier's at (a, |c - 128|)), and
//
//   table = E|T[a, w] - a w| / E[a w]  over all 2^16 pairs of the multiplier as loaded.
//
// Both are fractions of the product they approximate, so they compare directly.
#ifndef TOPIARY_TRAINER_APPROX_CODE_USE_H_
#define TOPIARY_TRAINER_APPROX_CODE_USE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/conv/conv.h"
#include "trainer/nn/conv_engine.h"

namespace topiary {

struct CodeUse {
  std::string layer;
  std::string multiplier;
  double used_error_pct = 0;   // `used` above, in percent
  double table_error_pct = 0;  // `table` above, in percent
  // used >= kFarFactor * table and above kFarFloorPct: the table's metrics understate this
  // layer's error, so expect more accuracy loss than they suggest.
  bool far = false;
};

inline constexpr double kFarFactor = 3.0;
inline constexpr double kFarFloorPct = 1.0;

// `x` is the layer's input batch for `shape` (host, NHWC), `w` its filter (host, [K, R, S,
// C]), `approx` how the layer is approximated, `multiplier` the table as loaded (before any
// derivation or tuning), `running_range` the layer's [min, max, observed] in the
// moving-average mode (null otherwise). Codes are those the forward pass would use.
CodeUse MeasureCodeUse(const std::string& layer, const kernels::ConvShape& shape, const float* x,
                       const float* w, const ConvApproximation& approx,
                       const std::vector<uint16_t>& multiplier, const float* running_range);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_APPROX_CODE_USE_H_
