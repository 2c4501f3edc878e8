#include "trainer/data/batcher.h"

#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"
#include "trainer/core/random.h"
#include "trainer/data/image_folder.h"

namespace topiary {
namespace {
// Each epoch owns 2^40 Philox blocks of the shuffle stream: far more than it can use.
constexpr uint64_t kEpochStride = uint64_t{1} << 40;
}  // namespace

Normalization ComputeNormalization(const ImageSet& set, float max_value, bool normalize) {
  Normalization n;
  n.mean.assign(set.c, 0.0f);
  n.inv_std.assign(set.c, 1.0f);
  if (!normalize || set.size() == 0) return n;
  // A streamed set's statistics come from a sample decoded at load time.
  const std::vector<uint8_t>& pixels = set.streamed() ? set.files->sample : set.pixels;
  if (pixels.empty()) return n;
  std::vector<double> sum(set.c, 0.0), sq(set.c, 0.0);
  for (size_t i = 0; i < pixels.size(); ++i) {
    const double v = pixels[i] / static_cast<double>(max_value);
    sum[i % set.c] += v;
    sq[i % set.c] += v * v;
  }
  const double count = static_cast<double>(pixels.size() / set.c);
  for (int ch = 0; ch < set.c; ++ch) {
    const double mean = sum[ch] / count;
    const double var = std::max(sq[ch] / count - mean * mean, 1e-12);
    n.mean[ch] = static_cast<float>(mean);
    n.inv_std[ch] = static_cast<float>(1.0 / std::sqrt(var));
  }
  return n;
}

absl::StatusOr<Normalization> RunNormalization(const ImageSet& set, float max_value, bool normalize,
                                               const topiary::v1::InputFormat* recorded) {
  if (recorded == nullptr) return ComputeNormalization(set, max_value, normalize);
  const topiary::v1::InputFormat& input = *recorded;
  if (input.mean_size() != set.c || input.inv_std_size() != set.c) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data: the checkpoint's network reads %d-channel images normalized per channel (its "
        "recorded input format), and the data has %d channels",
        input.mean_size(), set.c));
  }
  Normalization norm;
  norm.mean.assign(input.mean().begin(), input.mean().end());
  norm.inv_std.assign(input.inv_std().begin(), input.inv_std().end());
  return norm;
}

topiary::v1::InputFormat DescribeInput(const ImageSet& set, int classes, float max_value,
                                       const Normalization& norm) {
  topiary::v1::InputFormat f;
  f.set_layout("NHWC");
  f.set_height(set.batch_h());
  f.set_width(set.batch_w());
  f.set_channels(set.c);
  f.set_classes(classes);
  f.set_max_value(max_value);
  for (float m : norm.mean) f.add_mean(m);
  for (float s : norm.inv_std) f.add_inv_std(s);
  return f;
}

Batcher::Batcher(const ImageSet* set, float max_value, const Normalization& norm,
                 topiary::v1::Augment augment, uint64_t seed)
    : set_(set), augment_(augment), seed_(seed) {
  const float scale = 1.0f / max_value;
  lut_.resize(256 * set->c);
  for (int ch = 0; ch < set->c; ++ch)
    for (int v = 0; v < 256; ++v)
      lut_[ch * 256 + v] = (v * scale - norm.mean[ch]) * norm.inv_std[ch];
}

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

kernels::AssembleParams Batcher::Params(int epoch, int64_t first, int count, bool augment) const {
  kernels::AssembleParams p;
  p.h = set_->h;
  p.w = set_->w;
  p.c = set_->c;
  p.out_h = set_->batch_h();
  p.out_w = set_->batch_w();
  p.count = count;
  p.first = first;
  p.epoch = epoch;
  p.augment = augment && augments();
  p.crop_padding = augment_.crop_padding();
  p.horizontal_flip = augment_.horizontal_flip();
  p.random_resized_crop = augment_.random_resized_crop();
  const auto key = Philox(seed_, RngStream::kAugment).key();
  p.key0 = key[0];
  p.key1 = key[1];
  return p;
}

void Batcher::Assemble(const std::vector<int32_t>& order, int epoch, int64_t first, int count,
                       bool augment, float* x, int32_t* labels) const {
  kernels::AssembleBatchCpu(Params(epoch, first, count, augment), set_->pixels.data(),
                            set_->labels.data(), order.data(), lut_.data(), x, labels);
}

}  // namespace topiary
