#include "trainer/util/png_canvas.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
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

// 3x5 pixels, row by row from the top.
const char* Glyph(char c) {
  switch (std::toupper(static_cast<unsigned char>(c))) {
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
    case 'A':
      return "010101111101101";
    case 'B':
      return "110101110101110";
    case 'C':
      return "011100100100011";
    case 'D':
      return "110101101101110";
    case 'E':
      return "111100110100111";
    case 'F':
      return "111100110100100";
    case 'G':
      return "011100101101011";
    case 'H':
      return "101101111101101";
    case 'I':
      return "111010010010111";
    case 'J':
      return "001001001101010";
    case 'K':
      return "101101110101101";
    case 'L':
      return "100100100100111";
    case 'M':
      return "101111111101101";
    case 'N':
      return "110101101101101";
    case 'O':
      return "010101101101010";
    case 'P':
      return "110101110100100";
    case 'Q':
      return "010101101110011";
    case 'R':
      return "110101110101101";
    case 'S':
      return "011100010001110";
    case 'T':
      return "111010010010010";
    case 'U':
      return "101101101101111";
    case 'V':
      return "101101101101010";
    case 'W':
      return "101101111111101";
    case 'X':
      return "101101010101101";
    case 'Y':
      return "101101010010010";
    case 'Z':
      return "111001010100111";
    case '.':
      return "000000000000010";
    case '%':
      return "101001010100101";
    case ':':
      return "000010000010000";
    case '_':
      return "000000000000111";
    case '/':
      return "001001010100100";
    case '(':
      return "010100100100010";
    case ')':
      return "010001001001010";
    case '=':
      return "000111000111000";
    default:
      return "000000000000000";
  }
}

}  // namespace

Canvas::Canvas(int width, int height)
    : width_(width), height_(height), rgb_(static_cast<size_t>(width) * height * 3, '\xff') {}

void Canvas::Set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  char* p = &rgb_[(static_cast<size_t>(y) * width_ + x) * 3];
  p[0] = static_cast<char>(c.r);
  p[1] = static_cast<char>(c.g);
  p[2] = static_cast<char>(c.b);
}

void Canvas::Fill(int x, int y, int w, int h, Rgb c) {
  for (int j = 0; j < h; ++j) {
    for (int i = 0; i < w; ++i) Set(x + i, y + j, c);
  }
}

void Canvas::Line(int x0, int y0, int x1, int y1, Rgb c, int thickness) {
  // Bresenham, each point a thickness x thickness square.
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  while (true) {
    Fill(x0 - thickness / 2, y0 - thickness / 2, thickness, thickness, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void Canvas::Text(int x, int y, const std::string& text, Rgb c) {
  for (char ch : text) {
    const char* g = Glyph(ch);
    for (int i = 0; i < 15; ++i) {
      if (g[i] == '1') Fill(x + 2 * (i % 3), y + 2 * (i / 3), 2, 2, c);
    }
    x += 8;
  }
}

std::string Canvas::Png() const {
  // Scanlines: a filter byte (0: none), then RGB per pixel.
  std::string raw;
  raw.reserve(static_cast<size_t>(height_) * (1 + 3 * width_));
  for (int y = 0; y < height_; ++y) {
    raw.push_back(0);
    raw.append(rgb_, static_cast<size_t>(y) * width_ * 3, static_cast<size_t>(width_) * 3);
  }
  uLongf packed_size = compressBound(raw.size());
  std::string packed(packed_size, '\0');
  compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
            reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9);
  packed.resize(packed_size);
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  AppendBigEndian(&header, width_);
  AppendBigEndian(&header, height_);
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, no filter, no interlace
  AppendChunk(&png, "IHDR", header);
  AppendChunk(&png, "IDAT", packed);
  AppendChunk(&png, "IEND", "");
  return png;
}

}  // namespace topiary
