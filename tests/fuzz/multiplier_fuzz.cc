// libFuzzer harness: multiplier tables (file contents) and multiplier names (families and
// their parameters). An input starting with 'N' is a name; anything else is a file's bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainer/approx/multiplier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  if (!input.empty() && input[0] == 'N') {
    const std::string name = input.substr(1);
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".bin") == 0) return 0;  // a path
    auto m = topiary::LoadMultiplier(name);
    if (m.ok() && (m->table.size() != 65536 || m->sha256.size() != 64)) __builtin_trap();
    return 0;
  }
  auto m = topiary::MultiplierFromBytes(input, "fuzz.bin");
  if (m.ok() != (size == topiary::kMultiplierFileBytes)) __builtin_trap();
  if (m.ok()) {
    const topiary::MultiplierMetrics x = topiary::ComputeMetrics(m->table);
    if (!(x.mae >= 0 && x.wce <= 65535 && x.ep_pct <= 100)) __builtin_trap();
  }
  return 0;
}
