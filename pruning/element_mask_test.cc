#include "pruning/element_mask.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/core/random.h"

namespace topiary::pruning {
namespace {

std::vector<float> RandomWeights(size_t n, uint64_t seed) {
  Philox rng(seed, RngStream::kData);
  std::vector<float> w(n);
  for (float& x : w) x = rng.Normal();
  return w;
}

TEST(Magnitude, ZeroesExactlyTheSmallestKeptMagnitudes) {
  const std::vector<float> w = RandomWeights(7 * 9 * 5, 1);
  std::vector<uint8_t> mask(w.size(), 1);
  mask[3] = 0;  // already pruned: stays, and does not count
  KernelView v{7, 9, 5, w.data()};
  EXPECT_EQ(ZeroSmallestMagnitudes({{v, &mask}}, 100), 100);
  std::vector<float> kept_mags, pruned_mags;
  for (size_t i = 0; i < w.size(); ++i) {
    if (i == 3) continue;
    (mask[i] ? kept_mags : pruned_mags).push_back(std::fabs(w[i]));
  }
  EXPECT_EQ(mask[3], 0);
  ASSERT_EQ(pruned_mags.size(), 100u);
  EXPECT_LT(*std::max_element(pruned_mags.begin(), pruned_mags.end()),
            *std::min_element(kept_mags.begin(), kept_mags.end()));
}

TEST(Magnitude, GlobalThresholdSpansLayers) {
  // Layer b's weights are 100x smaller: a global threshold takes all of them first.
  std::vector<float> a = RandomWeights(200, 2), b = RandomWeights(50, 3);
  for (float& x : a) x = 1.0f + std::fabs(x);
  for (float& x : b) x *= 0.01f;
  std::vector<uint8_t> ma(a.size(), 1), mb(b.size(), 1);
  KernelView va{10, 1, 20, a.data()}, vb{5, 1, 10, b.data()};
  EXPECT_EQ(ZeroSmallestMagnitudes({{va, &ma}, {vb, &mb}}, 60), 60);
  EXPECT_EQ(std::count(mb.begin(), mb.end(), 0), 50);
  EXPECT_EQ(std::count(ma.begin(), ma.end(), 0), 10);
}

TEST(Magnitude, AskingForMoreThanIsKeptZeroesWhatIsLeft) {
  const std::vector<float> w = RandomWeights(12, 4);
  std::vector<uint8_t> mask(w.size(), 1);
  KernelView v{3, 1, 4, w.data()};
  EXPECT_EQ(ZeroSmallestMagnitudes({{v, &mask}}, 50), 12);
  EXPECT_EQ(ZeroSmallestMagnitudes({{v, &mask}}, 1), 0);
}

TEST(NofM, KeepsTheLargestNOfEveryMAlongInputChannels) {
  for (auto [n, m] : {std::pair{2, 4}, {1, 4}, {3, 8}}) {
    const int out = 5, taps = 9, in = 3 * m;
    const std::vector<float> w = RandomWeights(out * taps * in, n * 10 + m);
    std::vector<uint8_t> mask(w.size(), 1);
    KernelView v{out, taps, in, w.data()};
    ApplyNofM(v, n, m, &mask);
    EXPECT_TRUE(SatisfiesNofM(v, n, m, mask));
    EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), static_cast<long>(w.size()) / m * n);
    // Every kept weight of a group is at least as large as every pruned one.
    for (int k = 0; k < out; ++k) {
      for (int t = 0; t < taps; ++t) {
        for (int c0 = 0; c0 < in; c0 += m) {
          float min_kept = 1e30f, max_pruned = 0;
          for (int j = 0; j < m; ++j) {
            const size_t i = v.index(k, t, c0 + j);
            if (mask[i])
              min_kept = std::min(min_kept, std::fabs(w[i]));
            else
              max_pruned = std::max(max_pruned, std::fabs(w[i]));
          }
          EXPECT_GE(min_kept, max_pruned);
        }
      }
    }
  }
}

TEST(NofM, IsMonotoneAndDetectsViolations) {
  const std::vector<float> w = RandomWeights(16, 9);
  std::vector<uint8_t> mask(16, 1);
  mask[0] = mask[5] = mask[6] = 0;  // group 0 has one zero, group 1 two
  KernelView v{1, 1, 16, w.data()};
  EXPECT_FALSE(SatisfiesNofM(v, 2, 4, mask));
  ApplyNofM(v, 2, 4, &mask);
  EXPECT_EQ(mask[0], 0);
  EXPECT_EQ(mask[5], 0);
  EXPECT_EQ(mask[6], 0);
  EXPECT_TRUE(SatisfiesNofM(v, 2, 4, mask));
}

}  // namespace
}  // namespace topiary::pruning
