#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/conv/sampled_grad.h"
#include "kernels/runtime/parallel.h"

namespace topiary::kernels {

absl::Status CheckSampledWeightGradShape(const ConvShape& s, int top_k) {
  if (auto st = CheckConvShape(s); !st.ok()) return st;
  if (top_k < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("top_k must be at least 1, not %d", top_k));
  }
  const int64_t limit = int64_t{1} << 31;
  if (static_cast<int64_t>(s.n) * s.h * s.w * s.c >= limit ||
      static_cast<int64_t>(s.n) * s.ho() * s.wo() * s.k >= limit ||
      static_cast<int64_t>(s.n) * s.k * KeptPositions(s, top_k) >= limit) {
    return absl::InvalidArgumentError(
        "a sampled weight gradient's input, output gradient and kept positions must each have "
        "fewer than 2^31 elements");
  }
  return absl::OkStatus();
}

size_t SampledWeightGradWorkspaceBytesCpu(const ConvShape& shape, int top_k) {
  return SampledGradWorkspace(shape, top_k, nullptr, 0, CpuThreads()).bytes;
}

namespace {

// Step 1-3 for every (image, output channel): the sums, and the kept positions with their
// weights (in rank order) unless every position is kept.
void Select(const ConvShape& s, const float* dy, const SampledGradWorkspace& ws) {
  const int positions = s.ho() * s.wo();
  const int kk = ws.kk;
  const bool all = kk == positions;
  ParallelFor(static_cast<int64_t>(s.n) * s.k, [&](int64_t begin, int64_t end, int thread) {
    int32_t* order = ws.order + static_cast<size_t>(thread) * positions;
    for (int64_t nk = begin; nk < end; ++nk) {
      const int64_t n = nk / s.k, k = nk % s.k;
      const float* g = dy + n * positions * s.k + k;  // g[p * K]: dY[n, p, k]
      float sum = 0.0f;
      for (int p = 0; p < positions; ++p) sum += g[static_cast<int64_t>(p) * s.k];
      ws.sums[nk] = sum;
      if (all) continue;
      // Larger |dY| first; among equal magnitudes, the earlier position.
      auto before = [&](int32_t a, int32_t b) {
        const float ma = std::fabs(g[static_cast<int64_t>(a) * s.k]);
        const float mb = std::fabs(g[static_cast<int64_t>(b) * s.k]);
        return ma > mb || (ma == mb && a < b);
      };
      for (int p = 0; p < positions; ++p) order[p] = p;
      std::partial_sort(order, order + kk, order + positions, before);
      float kept = 0.0f, kept_abs = 0.0f;
      for (int t = 0; t < kk; ++t) {
        const float v = g[static_cast<int64_t>(order[t]) * s.k];
        kept += v;
        kept_abs += std::fabs(v);
      }
      const float r = SampleRatio(sum, kept, kept_abs, false);
      for (int t = 0; t < kk; ++t) {
        ws.positions[nk * kk + t] = order[t];
        ws.weights[nk * kk + t] = r * g[static_cast<int64_t>(order[t]) * s.k];
      }
    }
  });
}

}  // namespace

void SampledWeightGradCpu(const ConvShape& s, const WeightGradSampling& sampling, const float* x,
                          const float* dy, const uint8_t* mask, float* dw, float* dbias,
                          void* workspace) {
  const SampledGradWorkspace ws(s, sampling.top_k, workspace, 0, CpuThreads());
  Select(s, dy, ws);
  const int positions = s.ho() * s.wo();
  const bool all = ws.kk == positions;
  const int64_t patch = s.patch();
  ParallelFor(s.k, [&](int64_t begin, int64_t end, int) {
    for (int64_t k = begin; k < end; ++k) {
      float* out = dw + k * patch;
      std::fill(out, out + patch, 0.0f);
      for (int64_t n = 0; n < s.n; ++n) {
        for (int t = 0; t < ws.kk; ++t) {
          const int64_t at = (n * s.k + k) * ws.kk + t;
          const int p = all ? t : ws.positions[at];
          const float weight = all ? dy[(n * positions + p) * s.k + k] : ws.weights[at];
          const int h0 = (p / s.wo()) * s.stride_h - s.pad_h;
          const int w0 = (p % s.wo()) * s.stride_w - s.pad_w;
          for (int i = 0; i < s.r; ++i) {
            const int h = h0 + i;
            if (h < 0 || h >= s.h) continue;
            for (int j = 0; j < s.s; ++j) {
              const int w = w0 + j;
              if (w < 0 || w >= s.w) continue;
              const float* in = x + ((n * s.h + h) * s.w + w) * s.c;
              float* o = out + (static_cast<int64_t>(i) * s.s + j) * s.c;
              for (int c = 0; c < s.c; ++c) o[c] += weight * in[c];
            }
          }
        }
      }
      for (int64_t e = 0; e < patch; ++e) {
        out[e] = mask != nullptr && mask[k * patch + e] == 0 ? 0.0f : sampling.scale * out[e];
      }
      if (dbias != nullptr) {
        float b = 0.0f;
        for (int64_t n = 0; n < s.n; ++n) b += ws.sums[n * s.k + k];
        dbias[k] = b;
      }
    }
  });
}

}  // namespace topiary::kernels
