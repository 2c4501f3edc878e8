#include "pruning/element_mask.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace topiary::pruning {

int64_t ZeroSmallestMagnitudes(const std::vector<MaskedKernel>& kernels, int64_t count) {
  struct Candidate {
    float magnitude;
    uint32_t kernel;
    uint32_t index;
  };
  std::vector<Candidate> kept;
  for (size_t k = 0; k < kernels.size(); ++k) {
    const KernelView& v = kernels[k].view;
    const std::vector<uint8_t>& mask = *kernels[k].mask;
    for (size_t i = 0; i < v.size(); ++i) {
      if (mask[i]) {
        kept.push_back({std::fabs(v.w[i]), static_cast<uint32_t>(k), static_cast<uint32_t>(i)});
      }
    }
  }
  count = std::min<int64_t>(count, static_cast<int64_t>(kept.size()));
  if (count <= 0) return 0;
  auto less = [](const Candidate& a, const Candidate& b) {
    return std::tie(a.magnitude, a.kernel, a.index) < std::tie(b.magnitude, b.kernel, b.index);
  };
  std::nth_element(kept.begin(), kept.begin() + (count - 1), kept.end(), less);
  for (int64_t i = 0; i < count; ++i) (*kernels[kept[i].kernel].mask)[kept[i].index] = 0;
  return count;
}

void ApplyNofM(const KernelView& v, int n, int m, std::vector<uint8_t>* mask) {
  std::vector<int> group(m);
  for (int k = 0; k < v.out; ++k) {
    for (int t = 0; t < v.taps; ++t) {
      for (int c0 = 0; c0 < v.in; c0 += m) {
        const size_t base = v.index(k, t, c0);
        for (int j = 0; j < m; ++j) group[j] = j;
        // Kept weights first, by descending magnitude; the first n survive.
        std::stable_sort(group.begin(), group.end(), [&](int a, int b) {
          const bool ka = (*mask)[base + a], kb = (*mask)[base + b];
          if (ka != kb) return ka;
          return std::fabs(v.w[base + a]) > std::fabs(v.w[base + b]);
        });
        for (int j = n; j < m; ++j) (*mask)[base + group[j]] = 0;
      }
    }
  }
}

bool SatisfiesNofM(const KernelView& v, int n, int m, const std::vector<uint8_t>& mask) {
  for (int k = 0; k < v.out; ++k) {
    for (int t = 0; t < v.taps; ++t) {
      for (int c0 = 0; c0 < v.in; c0 += m) {
        int nonzero = 0;
        for (int j = 0; j < m && c0 + j < v.in; ++j) {
          const size_t i = v.index(k, t, c0 + j);
          nonzero += mask[i] != 0 && v.w[i] != 0.0f;
        }
        if (nonzero > n) return false;
      }
    }
  }
  return true;
}

}  // namespace topiary::pruning
