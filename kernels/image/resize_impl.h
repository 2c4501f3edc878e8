// The per-pixel filter shared by resize_cpu.cc and resize_cuda.cu.
#ifndef TOPIARY_KERNELS_IMAGE_RESIZE_IMPL_H_
#define TOPIARY_KERNELS_IMAGE_RESIZE_IMPL_H_

#include "kernels/image/resize.h"
#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

// Output position o of `out` along an axis whose box starts at `start` and spans `len` source
// pixels (the image `size` long): the filter's centre and radius in Q16 source pixels and its
// first and last taps inside the image.
struct AxisFilter {
  int64_t centre = 0, radius = 0;
  int64_t inverse = 0;  // 2^44 / radius: weights by multiplying, not dividing, per tap
  int first = 0, last = 0;
  TOPIARY_HD AxisFilter(int o, int out, int start, int len, int size) {
    // Source coordinate of the output pixel's centre: start + (o + 1/2) len / out - 1/2.
    centre = (static_cast<int64_t>(start) << 16) +
             (((2 * static_cast<int64_t>(o) + 1) * len) << 15) / out - (1 << 15);
    const int64_t scale = (static_cast<int64_t>(len) << 16) / out;
    radius = scale > (1 << 16) ? scale : (1 << 16);  // wider when shrinking: antialiasing
    inverse = (int64_t{1} << 44) / radius;
    // Taps strictly inside the radius: floor(centre - radius) + 1 .. ceil(centre + radius) - 1.
    int64_t lo = ((centre - radius) >> 16) + 1, hi = -((-(centre + radius)) >> 16) - 1;
    lo = lo < 0 ? 0 : lo;
    hi = hi > size - 1 ? size - 1 : hi;
    if (hi < lo) lo = hi = centre < 0 ? 0 : (centre >> 16) > size - 1 ? size - 1 : centre >> 16;
    first = static_cast<int>(lo);
    last = static_cast<int>(hi);
  }
  // Q12 weight of tap i: 1 - |i - centre| / radius, >= 1 so an edge tap is never dropped.
  // (radius - d) * inverse <= radius * 2^44 / radius: 64 bits hold it for any scale.
  TOPIARY_HD int Weight(int i) const {
    int64_t d = (static_cast<int64_t>(i) << 16) - centre;
    d = d < 0 ? -d : d;
    const int64_t w = ((radius - d) * inverse) >> 32;
    return w < 1 ? 1 : static_cast<int>(w);
  }
};

// Output pixel (y, x), its c (1 or 3) channels written to dst.
TOPIARY_HD inline void ResizePixel(const ResizeJob& job, int c, int out_h, int out_w, int y, int x,
                                   uint8_t* dst) {
  const CropBox& b = job.box;
  const int ox = b.flip ? out_w - 1 - x : x;
  const AxisFilter fy(y, out_h, b.y0, b.h, job.height), fx(ox, out_w, b.x0, b.w, job.width);
  int64_t sum[3] = {0, 0, 0}, wy_sum = 0, wx_sum = 0;
  for (int i = fx.first; i <= fx.last; ++i) wx_sum += fx.Weight(i);
  for (int r = fy.first; r <= fy.last; ++r) {
    const uint8_t* row = job.pixels + static_cast<int64_t>(r) * job.stride;
    // Sums are bounded by 255 * 4096^2 * (the box's area over the output's), <= 2^62.
    int64_t row_sum[3] = {0, 0, 0};
    for (int i = fx.first; i <= fx.last; ++i) {
      const int w = fx.Weight(i);
      for (int k = 0; k < c; ++k) row_sum[k] += w * row[i * c + k];
    }
    const int wy = fy.Weight(r);
    for (int k = 0; k < c; ++k) sum[k] += wy * row_sum[k];
    wy_sum += wy;
  }
  const int64_t denom = wy_sum * wx_sum;
  for (int k = 0; k < c; ++k) dst[k] = static_cast<uint8_t>((sum[k] + denom / 2) / denom);
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_IMAGE_RESIZE_IMPL_H_
