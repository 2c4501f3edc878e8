#include "trainer/approx/error_png.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "trainer/util/png_canvas.h"

namespace topiary {
namespace {

// The diverging colour of a signed error: white at 0, red (too large) or blue (too small) at
// +-max_abs. Square root: small errors stay visible beside a few large ones.
Rgb ErrorColour(int err, int max_abs) {
  const double t = max_abs > 0 ? std::sqrt(std::abs(err) / static_cast<double>(max_abs)) : 0;
  const auto fade = static_cast<uint8_t>(std::lround(255 * (1 - t)));
  return {static_cast<uint8_t>(err > 0 ? 255 : fade), fade,
          static_cast<uint8_t>(err < 0 ? 255 : fade)};
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
  for (int a = 0; a < kSide; ++a) {
    for (int w = 0; w < kSide; ++w) {
      c.Set(kLeft + w, kTop + a, ErrorColour(table[(a << 8) | w] - a * w, max_abs));
    }
  }
  // Axes: the weight code w along the top, the activation code a down the left, with ticks.
  c.Text(kLeft + kSide / 2 - 4, 4, "w");
  c.Text(4, kTop + kSide / 2 - 5, "a");
  for (int v : {0, 64, 128, 192, 255}) {
    const std::string label = std::to_string(v);
    for (int d = 1; d <= 4; ++d) {
      c.Set(kLeft + v, kTop - d, {0, 0, 0});
      c.Set(kLeft - d, kTop + v, {0, 0, 0});
    }
    c.Text(kLeft + v - 4 * static_cast<int>(label.size()), kTop - 16, label);
    c.Text(kLeft - 6 - 8 * static_cast<int>(label.size()), kTop + v - 5, label);
  }
  // The colour scale: T[a, w] - a*w from +max_abs (top) to -max_abs (bottom).
  c.Text(kBarX - 4, kTop - 16, "err");
  for (int y = 0; y < kSide; ++y) {
    const int err = static_cast<int>(std::lround(max_abs * (1 - 2.0 * y / (kSide - 1))));
    c.Fill(kBarX, kTop + y, kBarW, 1, ErrorColour(err, max_abs));
  }
  const int label_x = kBarX + kBarW + 4;
  c.Text(label_x, kTop - 1, "+" + std::to_string(max_abs));
  c.Text(label_x, kTop + kSide / 2 - 5, "0");
  c.Text(label_x, kTop + kSide - 10, "-" + std::to_string(max_abs));
  return c.Png();
}

}  // namespace topiary
