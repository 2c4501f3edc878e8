#include "kernels/resize.h"
#include "kernels/resize_impl.h"

namespace topiary::kernels {

void CropResizeCpu(const ResizeJob& job, int c, int out_h, int out_w, uint8_t* out) {
  uint8_t* dst = out + static_cast<int64_t>(job.out_index) * out_h * out_w * c;
  for (int y = 0; y < out_h; ++y) {
    for (int x = 0; x < out_w; ++x, dst += c) ResizePixel(job, c, out_h, out_w, y, x, dst);
  }
}

}  // namespace topiary::kernels
