// A small RGB canvas written as PNG: pixels, lines, rectangles and text in a 3x5 pixel font
// (digits, letters shown as capitals, a few signs; drawn at twice that size, 8 px a
// character). For pictures a command writes (a multiplier's error surface, accuracy curves)
// without a plotting library.
#ifndef TOPIARY_TRAINER_UTIL_PNG_CANVAS_H_
#define TOPIARY_TRAINER_UTIL_PNG_CANVAS_H_

#include <cstdint>
#include <string>

namespace topiary {

struct Rgb {
  uint8_t r, g, b;
};

class Canvas {
 public:
  Canvas(int width, int height);  // white
  int width() const { return width_; }
  int height() const { return height_; }
  void Set(int x, int y, Rgb c);  // outside: ignored
  // A line `thickness` pixels wide from (x0, y0) to (x1, y1).
  void Line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1);
  void Fill(int x, int y, int w, int h, Rgb c);
  // Text with its top-left at (x, y), 8 px a character; characters without a glyph blank.
  void Text(int x, int y, const std::string& text, Rgb c = {0, 0, 0});
  // The PNG file's bytes (8-bit RGB, zlib-compressed).
  std::string Png() const;

 private:
  int width_, height_;
  std::string rgb_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_PNG_CANVAS_H_
