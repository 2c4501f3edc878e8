#include "tests/tools/image_files.h"

#include <png.h>
#include <turbojpeg.h>

#include <cstring>

namespace topiary::testing {

std::string EncodePng(const std::vector<uint8_t>& pixels, int width, int height, int channels) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = width;
  png.height = height;
  png.format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, pixels.data(), 0, nullptr)) return "";
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&png, out.data(), &size, 0, pixels.data(), 0, nullptr)) return "";
  out.resize(size);
  return out;
}

std::string EncodeJpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                       int quality) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc =
      tjCompress2(tj, pixels.data(), width, 0, height, channels == 3 ? TJPF_RGB : TJPF_GRAY, &buf,
                  &size, channels == 3 ? TJSAMP_420 : TJSAMP_GRAY, quality, 0);
  std::string out = rc == 0 ? std::string(reinterpret_cast<char*>(buf), size) : std::string();
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

}  // namespace topiary::testing
