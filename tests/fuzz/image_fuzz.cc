// libFuzzer harness: the image-folder decoders (JPEG through libjpeg-turbo, PNG through
// libpng) with their dimension bound, the header reader the streaming pipeline checks files
// with, and the resizes that follow a decode (the cache's fit and the stream's crop-and-resize
// over a box drawn from the input).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/image/resize.h"
#include "trainer/data/image_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto header = topiary::ReadImageSize(bytes, "fuzz", 1 << 20);
  if (header.ok() && (header->first < 1 || header->second < 1 ||
                      int64_t{header->first} * header->second > (1 << 20))) {
    __builtin_trap();
  }
  for (int channels : {1, 3}) {
    auto img = topiary::DecodeImage(bytes, "fuzz", channels, 1 << 20);
    if (!img.ok()) continue;
    if (img->pixels.size() != static_cast<size_t>(img->width) * img->height * channels) {
      __builtin_trap();
    }
    if (topiary::FitImage(*img, 7).size() != static_cast<size_t>(7 * 7 * channels)) {
      __builtin_trap();
    }
    // A box inside the image, from the input's first bytes.
    topiary::kernels::ResizeJob job;
    job.pixels = img->pixels.data();
    job.width = img->width;
    job.height = img->height;
    job.stride = img->width * channels;
    job.box.x0 = size > 0 ? data[0] % img->width : 0;
    job.box.y0 = size > 1 ? data[1] % img->height : 0;
    job.box.w = 1 + (size > 2 ? data[2] % (img->width - job.box.x0) : 0);
    job.box.h = 1 + (size > 3 ? data[3] % (img->height - job.box.y0) : 0);
    job.box.flip = size > 4 && (data[4] & 1);
    std::vector<uint8_t> out(5 * 6 * channels);
    topiary::kernels::CropResizeCpu(job, channels, 5, 6, out.data());
  }
  return 0;
}
