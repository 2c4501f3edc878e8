#include <algorithm>
#include <cmath>

#include "kernels/elementwise/loss.h"

namespace topiary::kernels {

double SoftmaxCrossEntropyCpu(int n, int classes, const float* logits, const int32_t* labels,
                              float smoothing, float* dlogits) {
  double total = 0.0;
  const double off = smoothing / classes;
  const double on = 1.0 - smoothing + off;
  for (int i = 0; i < n; ++i) {
    const float* z = logits + static_cast<size_t>(i) * classes;
    const float zmax = *std::max_element(z, z + classes);
    double sum = 0.0, zsum = 0.0;
    for (int j = 0; j < classes; ++j) {
      sum += std::exp(static_cast<double>(z[j]) - zmax);
      zsum += z[j];
    }
    const double log_z = zmax + std::log(sum);  // log-sum-exp
    const int y = labels[i];
    // -sum_j t_j (z_j - log_z) with t_j = off + (on - off) [j == y]
    total += log_z - off * zsum - (on - off) * z[y];
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<size_t>(i) * classes;
      for (int j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - log_z);
        d[j] = static_cast<float>((p - (j == y ? on : off)) / n);
      }
    }
  }
  return total / n;
}

int TopKCorrectCpu(int n, int classes, const float* logits, const int32_t* labels, int k) {
  int correct = 0;
  for (int i = 0; i < n; ++i) {
    const float* z = logits + static_cast<size_t>(i) * classes;
    const int y = labels[i];
    // Rank of the label: classes strictly greater, plus equal ones with a lower index.
    int rank = 0;
    for (int j = 0; j < classes; ++j) {
      if (z[j] > z[y] || (z[j] == z[y] && j < y)) ++rank;
    }
    if (rank < k) ++correct;
  }
  return correct;
}

}  // namespace topiary::kernels
