// The per-image draw and per-pixel source shared by augment_cpu.cc and augment_cuda.cu.
#ifndef TOPIARY_KERNELS_IMAGE_AUGMENT_IMPL_H_
#define TOPIARY_KERNELS_IMAGE_AUGMENT_IMPL_H_

#include "kernels/image/augment.h"
#include "kernels/runtime/philox.h"

namespace topiary::kernels {

struct Placement {
  int dy = 0, dx = 0;  // crop_padding's shift
  bool flip = false;
  int y0 = 0, x0 = 0, ch = 0, cw = 0;  // the source box the output samples
};

// floor(sqrt(v)) for v >= 0, in integers (the same on every device).
TOPIARY_HD inline int64_t IntSqrt(int64_t v) {
  int64_t r = 0;
  for (int64_t bit = int64_t{1} << 62; bit > 0; bit >>= 2) {
    if (v >= r + bit) {
      v -= r + bit;
      r = (r >> 1) + bit;
    } else {
      r >>= 1;
    }
  }
  return r;
}

// A random-resized crop's box from two draws: area 0.08 + 0.92 u0 of the image (Q16) and one
// of 17 log-spaced aspect ratios (w / h) from 3/4 to 4/3 (Q16, 65536 * 0.75 * (16/9)^(k/16)).
TOPIARY_HD inline void ResizedCropBox(const AssembleParams& p, uint32_t u0, uint32_t u1,
                                      uint32_t u2, uint32_t u3, Placement* pl) {
  constexpr int64_t kRatioQ16[17] = {49152, 50952, 52817, 54751, 56756, 58834, 60988, 63221, 65536,
                                     67936, 70423, 73002, 75674, 78445, 81317, 84295, 87381};
  const int64_t scale_q16 = 5243 + ((static_cast<int64_t>(u0 >> 16) * 60293) >> 16);
  const int64_t ratio_q16 = kRatioQ16[BelowFromBits(u1, 17)];
  const int64_t area = (static_cast<int64_t>(p.h) * p.w * scale_q16) >> 16;
  const int64_t cw = IntSqrt((area * ratio_q16) >> 16), ch = IntSqrt((area << 16) / ratio_q16);
  if (cw < 1 || ch < 1 || cw > p.w || ch > p.h) {  // does not fit: the whole image
    pl->y0 = pl->x0 = 0;
    pl->ch = p.h;
    pl->cw = p.w;
    return;
  }
  pl->ch = static_cast<int>(ch);
  pl->cw = static_cast<int>(cw);
  pl->y0 = static_cast<int>(BelowFromBits(u2, static_cast<uint32_t>(p.h - ch + 1)));
  pl->x0 = static_cast<int>(BelowFromBits(u3, static_cast<uint32_t>(p.w - cw + 1)));
}

// Where image j of the epoch's order lands: crop offsets, box and flip, from its own counter.
// Without augmentation (evaluation) the box is the centre out_h x out_w of the image.
TOPIARY_HD inline Placement DrawPlacement(const AssembleParams& p, int64_t j) {
  Placement pl;
  pl.ch = p.oh();
  pl.cw = p.ow();
  pl.y0 = (p.h - pl.ch) / 2;
  pl.x0 = (p.w - pl.cw) / 2;
  if (!p.augment) return pl;
  const Philox4 counter = {{static_cast<uint32_t>(p.epoch), static_cast<uint32_t>(j),
                            static_cast<uint32_t>(static_cast<uint64_t>(j) >> 32), 0u}};
  const Philox4 r = Philox4x32(counter, p.key0, p.key1);
  if (p.random_resized_crop) {
    Philox4 box_counter = counter;
    box_counter.v[3] = 1u;  // a second block of the same image's draws
    const Philox4 b = Philox4x32(box_counter, p.key0, p.key1);
    ResizedCropBox(p, b.v[0], b.v[1], b.v[2], b.v[3], &pl);
  } else if (p.crop_padding > 0) {
    const uint32_t span = 2 * p.crop_padding + 1;
    pl.dy = static_cast<int>(BelowFromBits(r.v[0], span)) - p.crop_padding;
    pl.dx = static_cast<int>(BelowFromBits(r.v[1], span)) - p.crop_padding;
  }
  pl.flip = p.horizontal_flip && (r.v[2] >> 31) != 0;
  return pl;
}

// The source byte offset of output pixel (y, x) in the image, or -1 for padding: the
// nearest source pixel of the box (the identity when the box is the output's size).
TOPIARY_HD inline int SourcePixel(const AssembleParams& p, const Placement& pl, int y, int x) {
  const int oh = p.oh(), ow = p.ow();
  const int ox = pl.flip ? ow - 1 - x : x;
  const int sy =
      pl.y0 + static_cast<int>((2 * static_cast<int64_t>(y) + 1) * pl.ch / (2 * oh)) + pl.dy;
  const int sx =
      pl.x0 + static_cast<int>((2 * static_cast<int64_t>(ox) + 1) * pl.cw / (2 * ow)) + pl.dx;
  if (sy < 0 || sy >= p.h || sx < 0 || sx >= p.w) return -1;
  return (sy * p.w + sx) * p.c;
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_IMAGE_AUGMENT_IMPL_H_
