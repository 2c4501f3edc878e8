#include "kernels/runtime/fast_divmod.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace topiary::kernels {
namespace {

void ExpectExact(int d, int n) {
  const FastDivmod f(d);
  int q = -1;
  const int r = f.Mod(n, &q);
  ASSERT_EQ(q, n / d) << n << " / " << d;
  ASSERT_EQ(r, n % d) << n << " % " << d;
  ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
}

// Every divisor the kernels use (tile and window widths, taps, vector counts) and the hard
// cases of the method: powers of two and their neighbours, and the largest divisors.
TEST(FastDivmodTest, MatchesIntegerDivision) {
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int b = 12; b <= 30; ++b) {
    for (int delta : {-1, 0, 1}) divisors.push_back((1 << b) + delta);
  }
  divisors.push_back(INT32_MAX);
  divisors.push_back(INT32_MAX - 1);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, INT32_MAX);
  for (int d : divisors) {
    // Around the multiples of d near 0 and near 2^31, and random numerators.
    for (int n = 0; n < 3 * d && n < 70000; ++n) ExpectExact(d, n);
    for (int k = 0; k < 64; ++k) ExpectExact(d, INT32_MAX - k);
    const int64_t top = static_cast<int64_t>(INT32_MAX) / d * d;
    for (int64_t n = top - 2; n <= top + 2 && n <= INT32_MAX; ++n) {
      if (n >= 0) ExpectExact(d, static_cast<int>(n));
    }
    for (int k = 0; k < 200; ++k) ExpectExact(d, any(rng));
  }
}

TEST(FastDivmodTest, DefaultIsDivisionByOne) {
  const FastDivmod f;
  EXPECT_EQ(f.divisor(), 1);
  EXPECT_EQ(f.Div(12345), 12345);
  EXPECT_EQ(f.Div(INT32_MAX), INT32_MAX);
}

}  // namespace
}  // namespace topiary::kernels
