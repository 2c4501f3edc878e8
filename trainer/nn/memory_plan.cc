#include "trainer/nn/memory_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace topiary {

ArenaPlan PackLifetimes(const std::vector<Lifetime>& items, size_t alignment) {
  auto round_up = [&](size_t n) { return (n + alignment - 1) / alignment * alignment; };
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return items[a].bytes > items[b].bytes; });
  ArenaPlan plan;
  plan.offsets.assign(items.size(), 0);
  std::vector<size_t> placed;
  std::vector<std::pair<size_t, size_t>> busy;  // [begin, end) of overlapping placed buffers
  for (size_t i : order) {
    const Lifetime& it = items[i];
    const size_t size = round_up(std::max<size_t>(it.bytes, 1));
    busy.clear();
    for (size_t j : placed) {
      const Lifetime& o = items[j];
      if (o.first <= it.last && it.first <= o.last) {
        busy.emplace_back(plan.offsets[j],
                          plan.offsets[j] + round_up(std::max<size_t>(o.bytes, 1)));
      }
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (begin >= offset + size) break;  // the gap before this one fits
      offset = std::max(offset, end);
    }
    plan.offsets[i] = offset;
    plan.bytes = std::max(plan.bytes, offset + size);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace topiary
