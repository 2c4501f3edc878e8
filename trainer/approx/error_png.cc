#include "trainer/approx/error_png.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace topiary {
namespace {

void AppendBigEndian(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}

// A chunk: length, type, data, CRC-32 of type and data.
void AppendChunk(std::string* out, const char* type, const std::string& data) {
  AppendBigEndian(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out->append(body);
  AppendBigEndian(out, static_cast<uint32_t>(
                           crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
}

}  // namespace

std::string ErrorSurfacePng(const std::vector<uint16_t>& table) {
  constexpr int kSide = 256;
  int max_abs = 0;
  for (int i = 0; i < kSide * kSide; ++i) {
    max_abs = std::max(max_abs, std::abs(table[i] - (i >> 8) * (i & 255)));
  }
  // Scanlines: a filter byte (0: none), then RGB per pixel.
  std::string raw;
  raw.reserve(kSide * (1 + 3 * kSide));
  for (int a = 0; a < kSide; ++a) {
    raw.push_back(0);
    for (int w = 0; w < kSide; ++w) {
      const int err = table[(a << 8) | w] - a * w;
      // Square root: small errors stay visible beside a few large ones.
      const double t = max_abs > 0 ? std::sqrt(std::abs(err) / static_cast<double>(max_abs)) : 0;
      const auto fade = static_cast<char>(std::lround(255 * (1 - t)));
      const char full = static_cast<char>(255);
      raw.push_back(err > 0 ? full : fade);  // red
      raw.push_back(fade);                   // green
      raw.push_back(err < 0 ? full : fade);  // blue
    }
  }
  uLongf packed_size = compressBound(raw.size());
  std::string packed(packed_size, '\0');
  compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
            reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9);
  packed.resize(packed_size);

  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  AppendBigEndian(&header, kSide);
  AppendBigEndian(&header, kSide);
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, no filter, no interlace
  AppendChunk(&png, "IHDR", header);
  AppendChunk(&png, "IDAT", packed);
  AppendChunk(&png, "IEND", "");
  return png;
}

}  // namespace topiary
