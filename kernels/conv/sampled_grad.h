// Sampled weight gradients: a convolution's filter gradient from a few positions of the
// output gradient instead of all of them (after Wang, Nelaturu and Amarasinghe, "Accelerated
// CNN Training Through Gradient Approximation", EMC2 2019). The input gradient stays exact.
//
// Exact:  dW[k, i, j, c] = sum_n sum_{h,w} dY[n, h, w, k] * Xpad[n, s*h + i, s*w + j, c].
// Sampled, per (image n, output channel k) with P = Ho*Wo positions and kk = min(top_k, P):
//   1. the kk positions t of largest |dY[n, t, k]| (ties: the earlier position in scan order);
//   2. S = sum over all P positions of dY[n, ., k] (signed), T = sum of the kept dY_t,
//      A = sum of the kept |dY_t|;
//   3. each kept position carries the weight r * dY_t, with r = S / T when |T| >= A / 2 (the
//      kept values mostly agree in sign) and r = 1 otherwise (they cancel: S / T would blow
//      up; the plain truncation is used instead). kk = 1 gives weight S (the reference's
//      "support vector"); kk = P gives weight dY_t (r is set to exactly 1), the exact gradient.
//   4. dW[k, i, j, c] = scale * sum_n sum_t weight_t * Xpad[n, s*h_t + i, s*w_t + j, c],
//      then entries whose mask is 0 are set to 0, and dbias[k] = sum_n S (exact).
// scale is 1 (an unbiased magnitude) or 1 / N (the reference kernel's undocumented choice).
//
// Cost: one pass over dY, then N * K * kk patches of R*S*C: O(N K (P + kk R S C)) instead of
// O(N K P R S C). The CPU version is the reference; the CUDA one selects the same positions
// and sums in a different order (results agree to float rounding).
#ifndef TOPIARY_KERNELS_CONV_SAMPLED_GRAD_H_
#define TOPIARY_KERNELS_CONV_SAMPLED_GRAD_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/dtype.h"
#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

struct CudaContext;

struct WeightGradSampling {
  int top_k = 1;       // positions kept per (image, output channel); >= 1
  float scale = 1.0f;  // 1, or 1 / N for the reference's behaviour
};

// Positions kept per (image, output channel) for this shape.
TOPIARY_HD inline int KeptPositions(const ConvShape& s, int top_k) {
  const int positions = s.ho() * s.wo();
  return top_k < positions ? top_k : positions;
}

// r of step 3 above; `all` is true when every position is kept.
TOPIARY_HD inline float SampleRatio(float sum, float kept_sum, float kept_abs_sum, bool all) {
  if (all || !(fabsf(kept_sum) >= 0.5f * kept_abs_sum) || kept_sum == 0.0f) return 1.0f;
  return sum / kept_sum;
}

// Where both backends keep their intermediates in the caller's workspace: per (image, output
// channel) the signed sum S, and (when fewer than all positions are kept) the kept positions
// and their weights; on the GPU, `splits` partial filter gradients (the images split into
// groups so that small layers still fill the GPU); on the CPU, one position index per output
// position and thread for the selection. base may be null to compute the size only.
struct SampledGradWorkspace {
  float* sums = nullptr;         // [N, K]
  int32_t* positions = nullptr;  // [N, K, kk], or null when every position is kept
  float* weights = nullptr;      // [N, K, kk], likewise
  float* partials = nullptr;     // [splits, K, R*S*C] (GPU)
  int32_t* order = nullptr;      // [threads, Ho*Wo] (CPU)
  int kk = 0;
  int splits = 0;
  size_t bytes = 0;

  SampledGradWorkspace(const ConvShape& s, int top_k, void* base, int splits_, int threads) {
    auto up = [](size_t n) { return (n + 255) / 256 * 256; };
    auto* b = static_cast<unsigned char*>(base);
    auto at = [&](size_t size) {
      unsigned char* p = b != nullptr && size > 0 ? b + bytes : nullptr;
      bytes += up(size);
      return p;
    };
    kk = KeptPositions(s, top_k);
    splits = splits_;
    const size_t nk = static_cast<size_t>(s.n) * s.k;
    const bool all = kk == s.ho() * s.wo();
    sums = reinterpret_cast<float*>(at(nk * sizeof(float)));
    positions = reinterpret_cast<int32_t*>(at(all ? 0 : nk * kk * sizeof(int32_t)));
    weights = reinterpret_cast<float*>(at(all ? 0 : nk * kk * sizeof(float)));
    partials =
        reinterpret_cast<float*>(at(static_cast<size_t>(splits) * s.k * s.patch() * sizeof(float)));
    order = reinterpret_cast<int32_t*>(
        at(static_cast<size_t>(threads) * s.ho() * s.wo() * sizeof(int32_t)));
  }
};

// OK when the shape is a valid convolution with fewer than 2^31 elements in x and dy and
// top_k >= 1; otherwise names the problem.
absl::Status CheckSampledWeightGradShape(const ConvShape& shape, int top_k);

// The CPU reference. dw [K, R, S, C] is overwritten; dbias [K] too when not null; mask
// (uint8, the layout of dw) may be null.
size_t SampledWeightGradWorkspaceBytesCpu(const ConvShape& shape, int top_k);
void SampledWeightGradCpu(const ConvShape& shape, const WeightGradSampling& sampling,
                          const float* x, const float* dy, const uint8_t* mask, float* dw,
                          float* dbias, void* workspace);

// On the GPU, x, dy and dw of type `dtype` (dw written in that type), dbias fp32; every
// pointer in device memory; no host round trip (a training step stays one CUDA graph).
size_t SampledWeightGradWorkspaceBytes(const ConvShape& shape, int top_k);
absl::Status SampledWeightGradCuda(DType dtype, const ConvShape& shape,
                                   const WeightGradSampling& sampling, const void* x,
                                   const void* dy, const uint8_t* mask, void* dw, float* dbias,
                                   void* workspace, const CudaContext& cuda);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_SAMPLED_GRAD_H_
