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

// A 3x5 pixel font for the labels (drawn at twice that size): the digits and the few
// letters the picture needs.
const char* Glyph(char c) {
  switch (c) {
    case '0':
      return "111101101101111";
    case '1':
      return "010110010010111";
    case '2':
      return "111001111100111";
    case '3':
      return "111001111001111";
    case '4':
      return "101101111001001";
    case '5':
      return "111100111001111";
    case '6':
      return "111100111101111";
    case '7':
      return "111001001001001";
    case '8':
      return "111101111101111";
    case '9':
      return "111101111001111";
    case '-':
      return "000000111000000";
    case '+':
      return "000010111010000";
    case 'a':
      return "000111011101111";
    case 'w':
      return "000101101111101";
    case 'e':
      return "000111111100111";
    case 'r':
      return "000110101100100";
    default:
      return "000000000000000";
  }
}

// An RGB canvas, white at first.
struct Canvas {
  int width, height;
  std::string rgb;
  Canvas(int w, int h) : width(w), height(h), rgb(static_cast<size_t>(w) * h * 3, '\xff') {}
  void Set(int x, int y, uint8_t r, uint8_t g, uint8_t b) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    char* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
    p[0] = static_cast<char>(r);
    p[1] = static_cast<char>(g);
    p[2] = static_cast<char>(b);
  }
  void Text(int x, int y, const std::string& text) {  // black, 2x scale, 8 px per character
    for (char c : text) {
      const char* g = Glyph(c);
      for (int i = 0; i < 15; ++i) {
        if (g[i] != '1') continue;
        for (int d = 0; d < 4; ++d) Set(x + 2 * (i % 3) + d % 2, y + 2 * (i / 3) + d / 2, 0, 0, 0);
      }
      x += 8;
    }
  }
};

// The diverging colour of a signed error: white at 0, red (too large) or blue (too small) at
// +-max_abs. Square root: small errors stay visible beside a few large ones.
void ErrorColour(int err, int max_abs, uint8_t rgb[3]) {
  const double t = max_abs > 0 ? std::sqrt(std::abs(err) / static_cast<double>(max_abs)) : 0;
  const auto fade = static_cast<uint8_t>(std::lround(255 * (1 - t)));
  rgb[0] = err > 0 ? 255 : fade;
  rgb[1] = fade;
  rgb[2] = err < 0 ? 255 : fade;
}

std::string EncodePng(const Canvas& c) {
  // Scanlines: a filter byte (0: none), then RGB per pixel.
  std::string raw;
  raw.reserve(static_cast<size_t>(c.height) * (1 + 3 * c.width));
  for (int y = 0; y < c.height; ++y) {
    raw.push_back(0);
    raw.append(c.rgb, static_cast<size_t>(y) * c.width * 3, static_cast<size_t>(c.width) * 3);
  }
  uLongf packed_size = compressBound(raw.size());
  std::string packed(packed_size, '\0');
  compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
            reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9);
  packed.resize(packed_size);
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  AppendBigEndian(&header, c.width);
  AppendBigEndian(&header, c.height);
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, no filter, no interlace
  AppendChunk(&png, "IHDR", header);
  AppendChunk(&png, "IDAT", packed);
  AppendChunk(&png, "IEND", "");
  return png;
}

}  // namespace

std::string ErrorSurfacePng(const std::vector<uint16_t>& table) {
  constexpr int kSide = 256, kLeft = kErrorPngLeft, kTop = kErrorPngTop, kBarX = kLeft + kSide + 24,
                kBarW = 16;
  int max_abs = 0;
  for (int i = 0; i < kSide * kSide; ++i) {
    max_abs = std::max(max_abs, std::abs(table[i] - (i >> 8) * (i & 255)));
  }
  Canvas c(kBarX + kBarW + 72, kTop + kSide + 16);
  uint8_t rgb[3];
  for (int a = 0; a < kSide; ++a) {
    for (int w = 0; w < kSide; ++w) {
      ErrorColour(table[(a << 8) | w] - a * w, max_abs, rgb);
      c.Set(kLeft + w, kTop + a, rgb[0], rgb[1], rgb[2]);
    }
  }
  // Axes: the weight code w along the top, the activation code a down the left, with ticks.
  c.Text(kLeft + kSide / 2 - 4, 4, "w");
  c.Text(4, kTop + kSide / 2 - 5, "a");
  for (int v : {0, 64, 128, 192, 255}) {
    const std::string label = std::to_string(v);
    for (int d = 1; d <= 4; ++d) {
      c.Set(kLeft + v, kTop - d, 0, 0, 0);
      c.Set(kLeft - d, kTop + v, 0, 0, 0);
    }
    c.Text(kLeft + v - 4 * static_cast<int>(label.size()), kTop - 16, label);
    c.Text(kLeft - 6 - 8 * static_cast<int>(label.size()), kTop + v - 5, label);
  }
  // The colour scale: T[a, w] - a*w from +max_abs (top) to -max_abs (bottom).
  c.Text(kBarX - 4, kTop - 16, "err");
  for (int y = 0; y < kSide; ++y) {
    const int err = static_cast<int>(std::lround(max_abs * (1 - 2.0 * y / (kSide - 1))));
    ErrorColour(err, max_abs, rgb);
    for (int x = 0; x < kBarW; ++x) c.Set(kBarX + x, kTop + y, rgb[0], rgb[1], rgb[2]);
  }
  const int label_x = kBarX + kBarW + 4;
  c.Text(label_x, kTop - 1, "+" + std::to_string(max_abs));
  c.Text(label_x, kTop + kSide / 2 - 5, "0");
  c.Text(label_x, kTop + kSide - 10, "-" + std::to_string(max_abs));
  return EncodePng(c);
}

}  // namespace topiary
