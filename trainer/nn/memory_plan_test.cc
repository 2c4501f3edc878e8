#include "trainer/nn/memory_plan.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace topiary {
namespace {

// No two buffers alive at a common step share a byte, every buffer is aligned and inside the
// arena, and the arena is no smaller than the most bytes alive at one step.
void ExpectValid(const std::vector<Lifetime>& items, const ArenaPlan& plan, size_t alignment) {
  ASSERT_EQ(plan.offsets.size(), items.size());
  int first = 0, last = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(plan.offsets[i] % alignment, 0u);
    EXPECT_LE(plan.offsets[i] + items[i].bytes, plan.bytes);
    first = std::min(first, items[i].first);
    last = std::max(last, items[i].last);
    for (size_t j = 0; j < i; ++j) {
      const bool together = items[i].first <= items[j].last && items[j].first <= items[i].last;
      const bool apart = plan.offsets[i] + items[i].bytes <= plan.offsets[j] ||
                         plan.offsets[j] + items[j].bytes <= plan.offsets[i];
      if (together && items[i].bytes > 0 && items[j].bytes > 0) {
        EXPECT_TRUE(apart) << i << " and " << j << " share memory while both alive";
      }
    }
  }
  size_t peak = 0;
  for (int t = first; t <= last; ++t) {
    size_t live = 0;
    for (const Lifetime& it : items) live += it.first <= t && t <= it.last ? it.bytes : 0;
    peak = std::max(peak, live);
  }
  EXPECT_GE(plan.bytes, peak);
}

TEST(MemoryPlanTest, DisjointLifetimesShareOneBuffer) {
  const std::vector<Lifetime> items = {{1000, 0, 1}, {1000, 2, 3}, {1000, 4, 5}};
  const ArenaPlan plan = PackLifetimes(items, 256);
  ExpectValid(items, plan, 256);
  EXPECT_EQ(plan.bytes, 1024u);
}

TEST(MemoryPlanTest, OverlappingLifetimesDoNotShare) {
  // Inclusive steps: a buffer read at step 3 and one written at step 3 must differ (a layer
  // reads its input and writes its output in the same step).
  const std::vector<Lifetime> items = {{512, 0, 3}, {512, 3, 5}, {256, 4, 4}};
  const ArenaPlan plan = PackLifetimes(items, 256);
  ExpectValid(items, plan, 256);
  EXPECT_EQ(plan.bytes, 1024u);  // the third fits where the first was
}

TEST(MemoryPlanTest, RandomLifetimesArePackedSafelyAndTightly) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<Lifetime> items;
    const int count = 1 + trial * 3;
    size_t total = 0;
    for (int i = 0; i < count; ++i) {
      const int a = static_cast<int>(gen() % 40) - 1, b = a + static_cast<int>(gen() % 12);
      items.push_back({gen() % 5000, a, b});
      total += (items.back().bytes + 255) / 256 * 256;
    }
    const ArenaPlan plan = PackLifetimes(items, 256);
    ExpectValid(items, plan, 256);
    EXPECT_LE(plan.bytes, std::max<size_t>(total, 256));
  }
}

}  // namespace
}  // namespace topiary
