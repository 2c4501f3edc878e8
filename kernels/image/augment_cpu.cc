#include "kernels/image/augment.h"
#include "kernels/image/augment_impl.h"
#include "kernels/runtime/parallel.h"

namespace topiary::kernels {

void AssembleBatchCpu(const AssembleParams& p, const uint8_t* pixels, const int32_t* labels,
                      const int32_t* order, const float* lut, float* x, int32_t* batch_labels) {
  const int64_t image = static_cast<int64_t>(p.h) * p.w * p.c;
  const int oh = p.oh(), ow = p.ow();
  const int64_t out_image = static_cast<int64_t>(oh) * ow * p.c;
  ParallelFor(p.count, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = p.first + i;
      const int32_t idx = order[j];
      batch_labels[i] = labels[idx];
      const Placement pl = DrawPlacement(p, j);
      const uint8_t* src = pixels + idx * image;
      float* dst = x + i * out_image;
      for (int y = 0; y < oh; ++y) {
        for (int xx = 0; xx < ow; ++xx) {
          const int s = SourcePixel(p, pl, y, xx);
          float* out = dst + (static_cast<int64_t>(y) * ow + xx) * p.c;
          for (int ch = 0; ch < p.c; ++ch) out[ch] = lut[ch * 256 + (s < 0 ? 0 : src[s + ch])];
        }
      }
    }
  });
}

}  // namespace topiary::kernels
