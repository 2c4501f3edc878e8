// The activations and gates of imported mobile networks (MobileNetV3, EfficientNet): sigmoid,
// SiLU (swish), leaky ReLU, hard sigmoid and hard swish, and the elementwise product that
// gates a feature map by another or by a per-channel scale (squeeze-and-excitation).
//
// Every backward reads the input x, not the output: SiLU and hard swish are not monotone, so
// their output does not determine the slope. The formulas are one set of TOPIARY_HD functions,
// so the CPU kernels and their CUDA twins compute the same thing.
#ifndef TOPIARY_KERNELS_ELEMENTWISE_ACTIVATION_H_
#define TOPIARY_KERNELS_ELEMENTWISE_ACTIVATION_H_

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/runtime/dtype.h"
#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

struct CudaContext;

enum class ActivationKind {
  kSigmoid,      // 1 / (1 + e^-x)
  kSilu,         // x * sigmoid(x)
  kLeakyRelu,    // x > 0 ? x : alpha * x
  kHardSigmoid,  // clamp(alpha * x + beta, 0, 1) (ONNX's; PyTorch's is alpha 1/6, beta 1/2)
  kHardSwish,    // x * clamp(x / 6 + 1/2, 0, 1)
};

struct ActivationFn {
  ActivationKind kind = ActivationKind::kSigmoid;
  float alpha = 0, beta = 0;  // kLeakyRelu: alpha; kHardSigmoid: alpha and beta
};

TOPIARY_HD inline float SigmoidOf(float x) { return 1.0f / (1.0f + expf(-x)); }

TOPIARY_HD inline float ActivationOf(const ActivationFn& p, float x) {
  switch (p.kind) {
    case ActivationKind::kSigmoid:
      return SigmoidOf(x);
    case ActivationKind::kSilu:
      return x * SigmoidOf(x);
    case ActivationKind::kLeakyRelu:
      return x > 0.0f ? x : p.alpha * x;
    case ActivationKind::kHardSigmoid:
      return fminf(fmaxf(p.alpha * x + p.beta, 0.0f), 1.0f);
    case ActivationKind::kHardSwish:
      return x * fminf(fmaxf(x * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
  }
  return 0.0f;
}

// d activation / dx at x. At the kinks, the slopes PyTorch's backward passes take: leaky
// ReLU's at 0 is alpha; hard sigmoid's is 0 at either end; hard swish's is x / 3 + 1/2 on
// [-3, 3] (-0.5 at -3, 1.5 at 3), 0 below and 1 above.
TOPIARY_HD inline float ActivationSlope(const ActivationFn& p, float x) {
  switch (p.kind) {
    case ActivationKind::kSigmoid: {
      const float s = SigmoidOf(x);
      return s * (1.0f - s);
    }
    case ActivationKind::kSilu: {
      const float s = SigmoidOf(x);
      return s * (1.0f + x * (1.0f - s));
    }
    case ActivationKind::kLeakyRelu:
      return x > 0.0f ? 1.0f : p.alpha;
    case ActivationKind::kHardSigmoid: {
      const float v = p.alpha * x + p.beta;
      return v > 0.0f && v < 1.0f ? p.alpha : 0.0f;
    }
    case ActivationKind::kHardSwish:
      return x < -3.0f ? 0.0f : x <= 3.0f ? x * (1.0f / 3.0f) + 0.5f : 1.0f;
  }
  return 0.0f;
}

// y = f(x); dx = dy * f'(x). x, y (forward) and dy, dx (backward) may alias.
void ActivationForwardCpu(const ActivationFn& p, int64_t n, const float* x, float* y);
void ActivationBackwardCpu(const ActivationFn& p, int64_t n, const float* x, const float* dy,
                           float* dx);

// The product of an NHWC tensor a ([rows, c] with rows = images * pixels) and b: of the same
// shape (pixels_per_image = 0), or one value per image and channel ([images, c], broadcast over
// the pixels: squeeze-and-excitation's scale). Backward: da = dy * b, db = dy * a (summed over
// the pixels when broadcast); a null da or db is not computed.
void MulForwardCpu(int64_t rows, int c, int pixels_per_image, const float* a, const float* b,
                   float* y);
void MulBackwardCpu(int64_t rows, int c, int pixels_per_image, const float* a, const float* b,
                    const float* dy, float* da, float* db);

// CUDA twins (device pointers, activations of type t, fp32 arithmetic; ctx.stream).
absl::Status ActivationForwardCuda(DType t, const ActivationFn& p, int64_t n, const void* x,
                                   void* y, const CudaContext& ctx);
absl::Status ActivationBackwardCuda(DType t, const ActivationFn& p, int64_t n, const void* x,
                                    const void* dy, void* dx, const CudaContext& ctx);
absl::Status MulForwardCuda(DType t, int64_t rows, int c, int pixels_per_image, const void* a,
                            const void* b, void* y, const CudaContext& ctx);
absl::Status MulBackwardCuda(DType t, int64_t rows, int c, int pixels_per_image, const void* a,
                             const void* b, const void* dy, void* da, void* db,
                             const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_ELEMENTWISE_ACTIVATION_H_
