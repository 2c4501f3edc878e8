// libFuzzer harness: CIFAR-10 and CIFAR-100 binary record files (the first byte picks which).
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainer/data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  topiary::ImageSet set;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (topiary::AppendCifarRecords(bytes, "cifar", data[0] & 1, &set).ok()) {
    if (set.pixels.size() != set.labels.size() * 3072) __builtin_trap();
  }
  return 0;
}
