// libFuzzer harness: the image-folder decoders (JPEG through libjpeg-turbo, PNG through
// libpng) with their dimension bound, and the resize that follows a decode.
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainer/data/image_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (int channels : {1, 3}) {
    auto img = topiary::DecodeImage(bytes, "fuzz", channels, 1 << 20);
    if (!img.ok()) continue;
    if (img->pixels.size() != static_cast<size_t>(img->width) * img->height * channels) {
      __builtin_trap();
    }
    if (topiary::FitImage(*img, 7).size() != static_cast<size_t>(7 * 7 * channels)) {
      __builtin_trap();
    }
  }
  return 0;
}
