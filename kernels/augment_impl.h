// The per-image draw and per-pixel source shared by augment_cpu.cc and augment_cuda.cu.
#ifndef TOPIARY_KERNELS_AUGMENT_IMPL_H_
#define TOPIARY_KERNELS_AUGMENT_IMPL_H_

#include "kernels/augment.h"
#include "kernels/philox.h"

namespace topiary::kernels {

struct Placement {
  int dy = 0, dx = 0;
  bool flip = false;
};

// Where image j of the epoch's order lands: crop offsets and flip, from its own counter.
TOPIARY_HD inline Placement DrawPlacement(const AssembleParams& p, int64_t j) {
  Placement pl;
  if (!p.augment) return pl;
  const Philox4 r = Philox4x32(Philox4{{static_cast<uint32_t>(p.epoch), static_cast<uint32_t>(j),
                                        static_cast<uint32_t>(static_cast<uint64_t>(j) >> 32), 0u}},
                               p.key0, p.key1);
  if (p.crop_padding > 0) {
    const uint32_t span = 2 * p.crop_padding + 1;
    pl.dy = static_cast<int>(BelowFromBits(r.v[0], span)) - p.crop_padding;
    pl.dx = static_cast<int>(BelowFromBits(r.v[1], span)) - p.crop_padding;
  }
  pl.flip = p.horizontal_flip && (r.v[2] >> 31) != 0;
  return pl;
}

// The source byte offset of output pixel (y, x) in the image, or -1 for padding.
TOPIARY_HD inline int SourcePixel(const AssembleParams& p, const Placement& pl, int y, int x) {
  const int sy = y + pl.dy;
  const int sx = (pl.flip ? p.w - 1 - x : x) + pl.dx;
  if (sy < 0 || sy >= p.h || sx < 0 || sx >= p.w) return -1;
  return (sy * p.w + sx) * p.c;
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_AUGMENT_IMPL_H_
