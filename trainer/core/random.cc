#include "trainer/core/random.h"

#include <cmath>

#include "kernels/runtime/philox.h"

namespace topiary {

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  const kernels::Philox4 r = kernels::Philox4x32({{c[0], c[1], c[2], c[3]}}, k[0], k[1]);
  return {r.v[0], r.v[1], r.v[2], r.v[3]};
}

Philox::Philox(uint64_t seed, RngStream stream) {
  // The stream id goes into the key's high bits so (seed, stream) pairs never collide for
  // seeds below 2^32; larger seeds are folded in.
  const uint32_t s = static_cast<uint32_t>(stream);
  key_ = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32) ^ (s * 0x9E3779B9u)};
}

void Philox::Refill() {
  block_ = Philox4x32(
      {static_cast<uint32_t>(counter_), static_cast<uint32_t>(counter_ >> 32), 0u, 0u}, key_);
  ++counter_;
  index_ = 0;
}

uint32_t Philox::NextU32() {
  if (index_ >= 4) Refill();
  return block_[index_++];
}

float Philox::Uniform() { return static_cast<float>(NextU32() >> 8) * (1.0f / 16777216.0f); }

uint32_t Philox::Below(uint32_t n) {
  const uint32_t limit = UINT32_MAX - UINT32_MAX % n;
  uint32_t x;
  do {
    x = NextU32();
  } while (x >= limit);
  return x % n;
}

float Philox::Normal() {
  // u1 in (0, 1] so the logarithm is finite.
  const double u1 = (static_cast<double>(NextU32()) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(NextU32()) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

void Philox::Restore(uint64_t counter, int index) {
  if (index < 4) {
    counter_ = counter - 1;
    Refill();
  }
  counter_ = counter;
  index_ = index;
}

}  // namespace topiary
