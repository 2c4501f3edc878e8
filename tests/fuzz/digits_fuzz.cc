// libFuzzer harness: scikit-learn's digits CSV.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainer/data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto ds = topiary::ParseDigitsCsv(text, "digits.csv");
  if (!ds.ok()) return 0;
  for (const topiary::ImageSet* s : {&ds->train, &ds->test}) {
    if (s->pixels.size() != static_cast<size_t>(s->size()) * 64) __builtin_trap();
    for (uint8_t p : s->pixels) {
      if (p > 16) __builtin_trap();
    }
    for (int32_t l : s->labels) {
      if (l < 0 || l > 9) __builtin_trap();
    }
  }
  return 0;
}
