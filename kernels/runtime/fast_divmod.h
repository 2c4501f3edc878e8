// Division by a divisor that a kernel launch fixes (a tile width, a window width, a filter's
// taps), as a multiply-high, an add and a shift: a 32-bit integer division has no instruction
// on NVIDIA GPUs and compiles to about 20, and the direct convolutions' index arithmetic did
// dozens of them per thread. The method is Granlund and Montgomery's ("Division by invariant
// integers using multiplication", PLDI 1994): for 1 <= d < 2^31 with l = ceil(log2 d) and
// m = floor(2^32 (2^l - d) / d) + 1, every 0 <= n < 2^31 has n / d = (mulhi(n, m) + n) >> l.
#ifndef TOPIARY_KERNELS_RUNTIME_FAST_DIVMOD_H_
#define TOPIARY_KERNELS_RUNTIME_FAST_DIVMOD_H_

#include <cstdint>

#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

class FastDivmod {
 public:
  FastDivmod() = default;
  // divisor in [1, 2^31).
  explicit FastDivmod(int divisor) : d_(static_cast<uint32_t>(divisor)) {
    while ((uint64_t{1} << l_) < d_) ++l_;
    m_ = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << l_) - d_)) / d_ + 1);
  }
  TOPIARY_HD int divisor() const { return static_cast<int>(d_); }
  // n / divisor for 0 <= n < 2^31.
  TOPIARY_HD int Div(int n) const {
    const uint32_t u = static_cast<uint32_t>(n);
    return static_cast<int>((MulHi(u, m_) + u) >> l_);
  }
  // n % divisor, with the quotient in *q.
  TOPIARY_HD int Mod(int n, int* q) const {
    *q = Div(n);
    return n - *q * static_cast<int>(d_);
  }

 private:
  TOPIARY_HD static uint32_t MulHi(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
  }
  uint32_t d_ = 1, m_ = 1;  // d = 1: l = 0, m = 1 gives n
  uint32_t l_ = 0;
};

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_FAST_DIVMOD_H_
