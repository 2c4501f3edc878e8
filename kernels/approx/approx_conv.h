// Approximate convolution: every multiplication of an 8x8-bit quantized convolution goes
// through a multiplier table T of 65,536 uint16 entries, T[(a << 8) | w] ~ a * w, with `a` the
// activation code and `w` the weight code (the order matters: approximate multipliers are
// not symmetric). The method of TFApprox (Vaverka et al., DATE 2020), with exact integer
// accumulation:
//
//   1. Ranges: min and max over the whole input batch and over the whole filter (or, with
//      per-channel weights, over each output channel's filter row).
//   2. Asymmetric uint8 quantization with TensorFlow's nudged zero point (ChooseQuantParams):
//      scale = (max - min) / 255, zp = clamp(round(-min / scale), 0, 255), and the code of x
//      is floor((x - offset) / scale + 0.5) clamped to 0..255, offset = -zp * scale.
//      The fake-quantized value of a code q is (q - zp) * scale, so 0 is exact: padding and
//      pruned weights are exactly 0 in the fake-quantized operands.
//   3. For each output, over its patch of P = R*S*C positions (padding positions carry the
//      activation code zp_a, the code of 0, and go through the table like any other):
//        acc = sum T[a_p, w_p] - zp_w * sum a_p - zp_a * sum w_p + P * zp_a * zp_w
//      in integers (the table sum in int32, exact for P <= 32768), and
//        y = (s_a * s_w) * acc + bias.
//      This is the float formula y = s_a s_w sum T + o_w sum xq + o_a sum wq - P o_a o_w with
//      xq, wq the fake-quantized operands, rearranged so that every sum is an integer. With
//      the exact table T[a, w] = a * w it equals the exact convolution of the fake-quantized
//      operands up to float rounding.
//
// The CPU version is the reference; the CUDA one (approx_conv_cuda.cu) computes the same
// integers and applies the same float operations, so their outputs are bit-identical.
#ifndef TOPIARY_KERNELS_APPROX_APPROX_CONV_H_
#define TOPIARY_KERNELS_APPROX_APPROX_CONV_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

constexpr int kMultiplierEntries = 65536;  // 256 activation codes x 256 weight codes
// The longest patch whose table sum cannot overflow int32 (65535 * 32768 < 2^31).
constexpr int kMaxApproxPatch = 32768;

// Quantization of one tensor; the fake-quantized value of code q is (q - zero_point) * scale.
struct QuantParams {
  float scale = 1.0f;
  int32_t zero_point = 0;
};

// TensorFlow's nudged asymmetric uint8 parameters for [min, max] (narrow range off). A
// constant tensor (max == min, where the formula would divide by zero) gets the range
// [min(v, 0), max(v, 0)] so that both v and 0 are representable; v == 0 gets scale 1.
TOPIARY_HD inline QuantParams ChooseQuantParams(float min, float max) {
  if (!(max > min)) {
    const float v = max;
    if (v == 0.0f || !(v == v)) return QuantParams{};
    min = v < 0.0f ? v : 0.0f;
    max = v > 0.0f ? v : 0.0f;
  }
  QuantParams q;
  q.scale = (max - min) / 255.0f;
  float zp = roundf(-min / q.scale);
  zp = zp < 0.0f ? 0.0f : (zp > 255.0f ? 255.0f : zp);
  q.zero_point = static_cast<int32_t>(zp);
  return q;
}

// The sign-magnitude weight mode (approximation { weight_code: SIGN_MAGNITUDE }): symmetric
// codes 128 + round(w / scale), scale = max|w| / 127, so code 128 is exactly 0 and
// |code - 128| is a 7-bit magnitude. A zero filter gets scale 1.
TOPIARY_HD inline QuantParams SymmetricQuantParams(float min, float max) {
  const float m = fmaxf(fabsf(min), fabsf(max));
  QuantParams q;
  q.scale = m > 0.0f ? m / 127.0f : 1.0f;
  q.zero_point = 128;
  return q;
}

// How weights become 8-bit codes, and over which range: the spec's approximation.weight_code
// and weight_scales, the checkpoint's weight_code and weight_scales attributes. One enum each
// from the spec's conversion (trainer/approx) through the layer to these kernels.
enum class WeightCode : uint8_t {
  kAsymmetric,    // ChooseQuantParams: TFApprox's uint8 codes with a zero point
  kSignMagnitude  // SymmetricQuantParams: code 128 is exactly 0 (the table: SignMagnitudeTable)
};
enum class WeightScales : uint8_t {
  kPerTensor,  // one range for the whole filter
  kPerChannel  // each output channel's (filter row's) own range
};
struct ApproxWeights {
  WeightCode code = WeightCode::kAsymmetric;
  WeightScales scales = WeightScales::kPerTensor;
};

// A filter's (or, per output channel, one filter row's) weight parameters for [min, max].
TOPIARY_HD inline QuantParams WeightParams(float min, float max, WeightCode code) {
  return code == WeightCode::kSignMagnitude ? SymmetricQuantParams(min, max)
                                            : ChooseQuantParams(min, max);
}

// floor((x - offset) / scale + 0.5) clamped to 0..255, offset = -zp * scale (NaN gives 0),
// evaluated as floor(x / scale + zp + 0.5): no multiply feeds an add, so no compiler can fuse
// one into an FMA on one backend and not the other, and codes stay identical on both.
TOPIARY_HD inline uint8_t QuantizeCode(float x, const QuantParams& q) {
  const float t = floorf(x / q.scale + static_cast<float>(q.zero_point) + 0.5f);
  if (!(t > 0.0f)) return 0;
  return t >= 255.0f ? 255 : static_cast<uint8_t>(t);
}

TOPIARY_HD inline float DequantizeCode(int code, const QuantParams& q) {
  return static_cast<float>(code - q.zero_point) * q.scale;
}

// y = (s_a * s_w) * acc + bias as one fused multiply-add (one rounding) on both backends.
TOPIARY_HD inline float ApproxOutput(int64_t acc, float scale_aw, float bias) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(static_cast<float>(acc), scale_aw, bias);
#else
  return std::fma(static_cast<float>(acc), scale_aw, bias);
#endif
}

// Activation ranges kept across batches (the moving-average range mode): running = [min, max,
// observed]. When `update`, the batch's range is folded in first (the first batch is taken as
// is, later ones move the range by kRangeMomentum of the difference); once observed, the
// activations are quantized with the running range, values outside it clamping to the end
// codes. Unobserved, or with running == null (the per-batch reference), the batch's own
// range is used. One function for both backends, with explicit FMAs, so both give the same bits.
constexpr float kRangeMomentum = 0.01f;
TOPIARY_HD inline QuantParams ActivationParams(float batch_min, float batch_max, float* running,
                                               bool update) {
  if (running == nullptr) return ChooseQuantParams(batch_min, batch_max);
  if (update) {
    if (running[2] == 0.0f) {
      running[0] = batch_min;
      running[1] = batch_max;
      running[2] = 1.0f;
    } else {
      running[0] = fmaf(kRangeMomentum, batch_min - running[0], running[0]);
      running[1] = fmaf(kRangeMomentum, batch_max - running[1], running[1]);
    }
  }
  return running[2] == 0.0f ? ChooseQuantParams(batch_min, batch_max)
                            : ChooseQuantParams(running[0], running[1]);
}

// The table the kernels use in the sign-magnitude mode, from a multiplier table T of
// unsigned products: entry (a, c) = 128 a + sign(c - 128) T[a, |c - 128|] (sign(0) = 0). With the
// weight zero point 128 the kernels' correction term -128 sum(a) cancels the 128 a, leaving sum
// sign(w) T[a, |w|]: the multiplier sees the magnitude, the sign is applied after the lookup, and a
// zero weight (code 128) contributes exactly 0 whatever T[a, 0] is. Entries below 0 or above 65535
// (a product off by more than 128 a) are clamped; the count of clamped entries is returned in
// `clamped` when not null. For the exact table the result is the exact table again (a c = 128 a + a
// (c - 128)).
inline std::vector<uint16_t> SignMagnitudeTable(const std::vector<uint16_t>& t,
                                                int* clamped = nullptr) {
  std::vector<uint16_t> out(kMultiplierEntries);
  int n = 0;
  for (int a = 0; a < 256; ++a) {
    for (int c = 0; c < 256; ++c) {
      const int m = c >= 128 ? c - 128 : 128 - c;
      const int64_t product = t[(a << 8) | m];
      // sign(c - 128): a zero weight (c = 128) multiplies to exactly 0, not to T[a, 0].
      const int64_t v = 128 * a + (c > 128 ? product : c < 128 ? -product : 0);
      n += v < 0 || v > 65535;
      out[(a << 8) | c] = static_cast<uint16_t>(v < 0 ? 0 : (v > 65535 ? 65535 : v));
    }
  }
  if (clamped != nullptr) *clamped = n;
  return out;
}

// OK for any valid conv shape whose patch is at most kMaxApproxPatch and whose input has
// fewer than 2^31 elements; otherwise names the problem.
absl::Status CheckApproxConvShape(const ConvShape& shape);

// Where the forward pass keeps its intermediates in the caller's workspace: four range
// words (GPU), the activation and weight codes, the per-channel weight-code sums, and (CPU)
// one patch buffer per thread. One layout for both backends; Bytes() is the size to plan.
struct ApproxConvWorkspace {
  int32_t* ranges = nullptr;  // ordered-int min, max of x; min, max of w
  uint8_t* a_codes = nullptr;
  uint8_t* w_codes = nullptr;
  int32_t* w_sum = nullptr;
  uint8_t* patches = nullptr;  // patch_buffers x R*S*C codes
  size_t bytes = 0;

  // base may be null to compute the size only.
  ApproxConvWorkspace(const ConvShape& s, void* base, int patch_buffers) {
    auto up = [](size_t n) { return (n + 255) / 256 * 256; };
    auto* b = static_cast<unsigned char*>(base);
    auto at = [&](size_t size) {
      unsigned char* p = b ? b + bytes : nullptr;
      bytes += up(size);
      return p;
    };
    ranges = reinterpret_cast<int32_t*>(at(4 * sizeof(int32_t)));
    a_codes = at(static_cast<size_t>(s.n) * s.h * s.w * s.c);
    w_codes = at(static_cast<size_t>(s.k) * s.patch());
    w_sum = reinterpret_cast<int32_t*>(at(s.k * sizeof(int32_t)));
    patches = at(static_cast<size_t>(patch_buffers) * s.patch());
  }
};

// How one forward pass quantizes.
struct ApproxConvOptions {
  // ActivationParams' arguments: the layer's running range (3 floats, in the pass's memory;
  // null: the per-batch range) and whether this pass moves it.
  float* running_range = nullptr;
  bool update_range = false;
  ApproxWeights weights;
};

// The quantization parameters one pass writes: the activation's, then one per output channel
// (all equal with WeightScales::kPerTensor): params[0], params[1 + k].
inline int ApproxParamCount(const ConvShape& shape) { return 1 + shape.k; }

// The weight parameters a forward pass uses, one per output channel (params[0, K), host
// memory): WeightParams over the whole filter's range, or over each filter row's own with
// WeightScales::kPerChannel. The CPU forward pass writes these; diagnostics that recompute a
// layer's codes (trainer/approx/code_use) call it too.
void ApproxWeightParamsCpu(const ConvShape& shape, const float* w, const ApproxConvOptions& options,
                           QuantParams* params);

// The whole forward pass: ranges, quantization parameters, codes and the table convolution,
// y[N, Ho, Wo, K] = approx_conv(x, w) (+ bias when not null). When xq is not null it receives
// the fake-quantized input (for the straight-through backward pass); wq always receives the
// fake-quantized filter; params (ApproxParamCount entries) receives the quantization
// parameters. With per-channel weights, output channel k's sums use its own zero point and
// scale: acc_k = sum T[a, w] - zp_w[k] sum a - zp_a sum w + P zp_a zp_w[k], y = (s_a s_w[k])
// acc_k + bias. The CPU and CUDA versions give bit-identical results.
// REQUIRES: CheckApproxConvShape(shape).ok(); workspace holds the Workspace bytes below.
size_t ApproxConvWorkspaceBytesCpu(const ConvShape& shape);  // depends on CpuThreads()
void ApproxConv2dForwardCpu(const ConvShape& shape, const float* x, const float* w,
                            const float* bias, const uint16_t* table, float* y, float* xq,
                            float* wq, QuantParams* params, void* workspace,
                            const ApproxConvOptions& options = {});

// On the GPU without a host round trip (a training step stays one CUDA graph). `table`,
// `params`, the running range and every buffer are in device memory.
size_t ApproxConvWorkspaceBytes(const ConvShape& shape);
// Allows the kernels the shared memory the table needs, on the current device. Call before
// the first forward pass and outside stream capture (e.g. when a network is planned).
absl::Status ApproxConvPrepareCuda();
absl::Status ApproxConv2dForwardCuda(const ConvShape& shape, const float* x, const float* w,
                                     const float* bias, const uint16_t* table, float* y, float* xq,
                                     float* wq, QuantParams* params, void* workspace,
                                     const CudaContext& cuda,
                                     const ApproxConvOptions& options = {});

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_APPROX_APPROX_CONV_H_
