// Element types of activations, and the numeric modes of the GPU engine.
//
// Parameters are always fp32 (the master copy the optimizer updates). Activations and their
// gradients are fp32, or bf16 in mixed precision; kernels that touch activations come in both
// element types (CUDA), and accumulate in fp32 either way.
#ifndef TOPIARY_KERNELS_RUNTIME_DTYPE_H_
#define TOPIARY_KERNELS_RUNTIME_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace topiary::kernels {

// bfloat16 storage: the upper 16 bits of an IEEE binary32. A distinct type (not uint16_t) so
// that overloads and templates cannot confuse it with integers. Arithmetic happens in fp32.
struct Bf16 {
  uint16_t bits;
};

enum class DType { kF32, kBf16 };

// fp32: IEEE single precision everywhere (the reference semantics). tf32: convolutions may
// round their operands to TF32 on tensor cores. bf16: bf16 activations, gradients and weight
// copies on tensor cores, fp32 accumulation, fp32 master weights and optimizer state.
enum class Precision { kFp32, kTf32, kBf16 };

inline DType ActivationType(Precision p) {
  return p == Precision::kBf16 ? DType::kBf16 : DType::kF32;
}
inline size_t SizeOf(DType t) { return t == DType::kBf16 ? 2 : 4; }
inline const char* PrecisionName(Precision p) {
  return p == Precision::kBf16 ? "bf16" : p == Precision::kTf32 ? "tf32" : "fp32";
}

// Host conversions (round to nearest even; NaN stays NaN), for tests and uploads.
inline Bf16 ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>(u >> 16)};
}
inline float FromBf16(Bf16 b) {
  const uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_DTYPE_H_
