// libFuzzer harness: IDX image and label files, raw or gzipped. The input is split in two at
// a position its first two bytes give; gzip inflation is bounded at 64 MiB.
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainer/data/dataset.h"
#include "trainer/util/file_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t split = std::min<size_t>(size - 2, (data[0] << 8 | data[1]));
  const char* body = reinterpret_cast<const char*>(data) + 2;
  constexpr uint64_t kLimit = uint64_t{64} << 20;
  auto images = topiary::InflateMaybeGzip(std::string(body, split), kLimit, "images");
  auto labels =
      topiary::InflateMaybeGzip(std::string(body + split, size - 2 - split), kLimit, "labels");
  if (!images.ok() || !labels.ok()) return 0;
  auto set = topiary::ParseIdxPair(std::move(*images), *labels, "images", "labels", 10);
  if (set.ok() && set->pixels.size() != set->labels.size() * set->image_bytes()) __builtin_trap();
  return 0;
}
