#include "trainer/batcher.h"

#include <cmath>
#include <numeric>

namespace topiary {
namespace {
// Each epoch owns 2^40 Philox blocks of a stream: far more than it can use.
constexpr uint64_t kEpochStride = uint64_t{1} << 40;
}  // namespace

Normalization ComputeNormalization(const ImageSet& set, float max_value, bool normalize) {
  Normalization n;
  n.mean.assign(set.c, 0.0f);
  n.inv_std.assign(set.c, 1.0f);
  if (!normalize || set.size() == 0) return n;
  std::vector<double> sum(set.c, 0.0), sq(set.c, 0.0);
  for (size_t i = 0; i < set.pixels.size(); ++i) {
    const double v = set.pixels[i] / static_cast<double>(max_value);
    sum[i % set.c] += v;
    sq[i % set.c] += v * v;
  }
  const double count = static_cast<double>(set.pixels.size() / set.c);
  for (int ch = 0; ch < set.c; ++ch) {
    const double mean = sum[ch] / count;
    const double var = std::max(sq[ch] / count - mean * mean, 1e-12);
    n.mean[ch] = static_cast<float>(mean);
    n.inv_std[ch] = static_cast<float>(1.0 / std::sqrt(var));
  }
  return n;
}

Batcher::Batcher(const ImageSet* set, float max_value, Normalization norm,
                 topiary::v1::Augment augment, uint64_t seed)
    : set_(set), scale_(1.0f / max_value), norm_(std::move(norm)), augment_(augment), seed_(seed) {}

std::vector<int32_t> Batcher::EpochOrder(int epoch) const {
  std::vector<int32_t> order(set_->size());
  std::iota(order.begin(), order.end(), 0);
  Philox rng(seed_, RngStream::kShuffle);
  rng.Restore(static_cast<uint64_t>(epoch) * kEpochStride, 4);
  for (size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[rng.Below(static_cast<uint32_t>(i))]);
  }
  return order;
}

Philox Batcher::AugmentStream(int epoch) const {
  Philox rng(seed_, RngStream::kAugment);
  rng.Restore(static_cast<uint64_t>(epoch) * kEpochStride, 4);
  return rng;
}

void Batcher::Assemble(const std::vector<int32_t>& order, int64_t first, int count, bool augment,
                       Philox* rng, float* x, int32_t* labels) const {
  const int h = set_->h, w = set_->w, c = set_->c;
  const int pad = augment ? augment_.crop_padding() : 0;
  // Lookup table: raw byte -> normalized float, per channel (pixels are bytes).
  std::vector<float> lut(256 * c);
  for (int ch = 0; ch < c; ++ch)
    for (int v = 0; v < 256; ++v)
      lut[ch * 256 + v] = (v * scale_ - norm_.mean[ch]) * norm_.inv_std[ch];
  for (int i = 0; i < count; ++i) {
    const int32_t idx = order[first + i];
    labels[i] = set_->labels[idx];
    const uint8_t* src = set_->pixels.data() + static_cast<size_t>(idx) * set_->image_bytes();
    float* dst = x + static_cast<size_t>(i) * h * w * c;
    int dy = 0, dx = 0;
    bool flip = false;
    if (pad > 0) {
      dy = static_cast<int>(rng->Below(2 * pad + 1)) - pad;
      dx = static_cast<int>(rng->Below(2 * pad + 1)) - pad;
    }
    if (augment && augment_.horizontal_flip()) flip = rng->Below(2) == 1;
    for (int y = 0; y < h; ++y) {
      const int sy = y + dy;
      for (int xx = 0; xx < w; ++xx) {
        const int sx0 = flip ? w - 1 - xx : xx;
        const int sx = sx0 + dx;
        float* out = dst + (static_cast<size_t>(y) * w + xx) * c;
        const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
        for (int ch = 0; ch < c; ++ch) {
          const uint8_t v = inside ? src[(static_cast<size_t>(sy) * w + sx) * c + ch] : 0;
          out[ch] = lut[ch * 256 + v];
        }
      }
    }
  }
}

}  // namespace topiary
