// Philox4x32-10 (Salmon et al., SC 2011), usable from host code and CUDA kernels: the CPU and
// the GPU draw the same numbers from the same (key, counter).
#ifndef TOPIARY_KERNELS_RUNTIME_PHILOX_H_
#define TOPIARY_KERNELS_RUNTIME_PHILOX_H_

#include <cstdint>

#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

struct Philox4 {
  uint32_t v[4];
};

TOPIARY_HD inline Philox4 Philox4x32(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c.v[2];
    c = Philox4{{static_cast<uint32_t>(p1 >> 32) ^ c.v[1] ^ k0, static_cast<uint32_t>(p1),
                 static_cast<uint32_t>(p0 >> 32) ^ c.v[3] ^ k1, static_cast<uint32_t>(p0)}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// An integer in [0, n) from 32 random bits (multiply-shift; bias below 2^-32 * n).
TOPIARY_HD inline uint32_t BelowFromBits(uint32_t bits, uint32_t n) {
  return static_cast<uint32_t>((static_cast<uint64_t>(bits) * n) >> 32);
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_PHILOX_H_
