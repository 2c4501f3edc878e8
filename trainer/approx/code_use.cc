#include "trainer/approx/code_use.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels/approx/approx_conv.h"

namespace topiary {

CodeUse MeasureCodeUse(const std::string& layer, const kernels::ConvShape& s, const float* x,
                       const float* w, const ConvApproximation& approx,
                       const std::vector<uint16_t>& multiplier, const float* running_range) {
  CodeUse u;
  u.layer = layer;
  u.multiplier = approx.multiplier;
  // The activation codes, as the forward pass chooses them (evaluation: the range not moved).
  const int64_t x_count = static_cast<int64_t>(s.n) * s.h * s.w * s.c;
  const auto [x_lo, x_hi] = std::minmax_element(x, x + x_count);
  float running[3];
  if (running_range != nullptr) std::copy(running_range, running_range + 3, running);
  const kernels::QuantParams qa =
      kernels::ActivationParams(*x_lo, *x_hi, running_range ? running : nullptr, false);
  std::vector<double> a_hist(256, 0.0);
  for (int64_t i = 0; i < x_count; ++i) a_hist[kernels::QuantizeCode(x[i], qa)] += 1;
  // Per weight code c: sum over the activations of |T'[a, c] - a c|; and sum |a - zp_a|.
  std::vector<double> err_at(256, 0.0);
  double a_size = 0;
  for (int a = 0; a < 256; ++a) {
    if (a_hist[a] == 0) continue;
    a_size += a_hist[a] * std::abs(a - qa.zero_point);
    for (int c = 0; c < 256; ++c) {
      err_at[c] += a_hist[a] * std::abs(static_cast<int>(approx.table[(a << 8) | c]) - a * c);
    }
  }
  // The weight codes, with the parameters the forward pass would choose.
  kernels::ApproxConvOptions o;
  o.weights = approx.weights;
  std::vector<kernels::QuantParams> qw(s.k);
  kernels::ApproxWeightParamsCpu(s, w, o, qw.data());
  const int patch = s.patch();
  double err = 0, size = 0;
  for (int k = 0; k < s.k; ++k) {
    for (int p = 0; p < patch; ++p) {
      const int c = kernels::QuantizeCode(w[static_cast<int64_t>(k) * patch + p], qw[k]);
      err += err_at[c];
      size += a_size * std::abs(c - qw[k].zero_point);
    }
  }
  // A layer whose products are all 0 (a pruned filter, say) still pays for every error.
  u.used_error_pct = 100.0 * err / std::max(size, 1.0);
  double table_err = 0;
  for (int a = 0; a < 256; ++a) {
    for (int c = 0; c < 256; ++c) table_err += std::abs(multiplier[(a << 8) | c] - a * c);
  }
  u.table_error_pct = 100.0 * table_err / (127.5 * 127.5 * 65536.0);  // E[a w] = 127.5^2
  u.far = u.used_error_pct >= kFarFactor * u.table_error_pct && u.used_error_pct > kFarFloorPct;
  return u;
}

}  // namespace topiary
