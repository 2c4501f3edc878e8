// libFuzzer harness: plan cache lines (trainer/nn/plan_cache.h), one per input line. A line
// that parses must format back to a line that parses to the same entry.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_split.h"
#include "trainer/nn/plan_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    auto entry = topiary::ConvPlanCache::ParseLine(std::string(line));
    if (!entry.ok()) continue;
    const std::string again = topiary::ConvPlanCache::FormatLine(entry->first, entry->second);
    auto back = topiary::ConvPlanCache::ParseLine(again);
    if (!back.ok() || back->first != entry->first) __builtin_trap();
    for (int p = 0; p < 3; ++p) {
      const auto &a = entry->second.pass[p], &b = back->second.pass[p];
      if (a.graph != b.graph || a.direct != b.direct || a.engine != b.engine || a.algo != b.algo ||
          a.math != b.math) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
