// A picture of a multiplier's error surface, for people who would rather look than read
// metrics: one pixel per table entry (256 x 256), row = activation code a (top: 0), column =
// weight code w (left: 0), colored by the signed error T[a, w] - a * w on a diverging scale:
// white where exact, red where the table is too large, blue where too small, full color at the
// table's largest absolute error. Labelled axes with ticks, and a colour bar with that error.
#ifndef TOPIARY_TRAINER_APPROX_ERROR_PNG_H_
#define TOPIARY_TRAINER_APPROX_ERROR_PNG_H_

#include <cstdint>
#include <string>
#include <vector>

namespace topiary {

// The PNG file's bytes (8-bit RGB, zlib-compressed). REQUIRES: table.size() == 65536.
// The plot's pixel (a, w) is at x = kErrorPngLeft + w, y = kErrorPngTop + a.
inline constexpr int kErrorPngLeft = 48, kErrorPngTop = 40;
std::string ErrorSurfacePng(const std::vector<uint16_t>& table);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_APPROX_ERROR_PNG_H_
