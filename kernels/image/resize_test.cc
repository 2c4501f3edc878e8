// The integer crop-and-resize filter against a float64 triangle filter with the same support,
// on awkward shapes (odd sizes, upscaling, strong downscaling, 1-pixel boxes, one channel).
#include "kernels/image/resize.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/image/resize_impl.h"  // the per-pixel form, to compare with
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

// The filter in float64: tent of radius max(1, scale) around each output pixel's centre,
// renormalized over the taps inside the image.
std::vector<double> Reference(const ResizeJob& job, int c, int oh, int ow) {
  std::vector<double> out(static_cast<size_t>(oh) * ow * c);
  auto taps = [](int o, int out, int start, int len, int size) {
    const double scale = static_cast<double>(len) / out;
    const double centre = start + (o + 0.5) * scale - 0.5, radius = std::max(1.0, scale);
    std::vector<std::pair<int, double>> t;
    for (int i = static_cast<int>(std::floor(centre - radius)); i <= centre + radius; ++i) {
      const double w = 1 - std::abs(i - centre) / radius;
      if (i >= 0 && i < size && w > 0) t.push_back({i, w});
    }
    return t;
  };
  for (int y = 0; y < oh; ++y) {
    for (int x = 0; x < ow; ++x) {
      const int ox = job.box.flip ? ow - 1 - x : x;
      const auto ty = taps(y, oh, job.box.y0, job.box.h, job.height);
      const auto tx = taps(ox, ow, job.box.x0, job.box.w, job.width);
      for (int k = 0; k < c; ++k) {
        double sum = 0, wsum = 0;
        for (auto [r, wy] : ty) {
          for (auto [i, wx] : tx) {
            sum += wy * wx * job.pixels[static_cast<size_t>(r) * job.stride + i * c + k];
            wsum += wy * wx;
          }
        }
        out[(static_cast<size_t>(y) * ow + x) * c + k] = sum / wsum;
      }
    }
  }
  return out;
}

struct Case {
  int width, height, c;
  CropBox box;
  int oh, ow;
};

TEST(CropResize, MatchesFloat64TriangleFilter) {
  const Case cases[] = {
      {500, 375, 3, {40, 17, 301, 257, false}, 224, 224},  // shrink, odd box
      {500, 375, 3, {0, 0, 500, 375, true}, 61, 47},       // strong shrink, flipped
      {31, 29, 3, {3, 5, 11, 9, false}, 28, 28},           // upscale
      {17, 13, 1, {0, 0, 17, 13, true}, 17, 13},           // identity size, one channel
      {9, 7, 3, {4, 3, 1, 1, false}, 5, 5},                // a one-pixel box
      {640, 8, 1, {0, 0, 640, 8, false}, 3, 8},            // 213x along one axis
  };
  std::mt19937 rng(7);
  for (const Case& cs : cases) {
    SCOPED_TRACE(::testing::Message()
                 << cs.width << "x" << cs.height << " -> " << cs.oh << "x" << cs.ow);
    std::vector<uint8_t> src(static_cast<size_t>(cs.width) * cs.height * cs.c);
    for (auto& v : src) v = static_cast<uint8_t>(rng() >> 24);
    ResizeJob job;
    job.pixels = src.data();
    job.width = cs.width;
    job.height = cs.height;
    job.stride = cs.width * cs.c;
    job.box = cs.box;
    job.out_index = 1;
    std::vector<uint8_t> out(2 * static_cast<size_t>(cs.oh) * cs.ow * cs.c, 7);
    CropResizeCpu(job, cs.c, cs.oh, cs.ow, out.data());
    const std::vector<double> ref = Reference(job, cs.c, cs.oh, cs.ow);
    const size_t plane = ref.size();
    for (size_t i = 0; i < plane; ++i) {
      ASSERT_EQ(out[i], 7) << "wrote outside its batch row";
      // Q12 weights: within one level of the exact filter.
      ASSERT_LE(std::abs(out[plane + i] - ref[i]), 1.0) << "at " << i;
    }
  }
}

// The CPU's separable form writes the per-pixel kernel's bytes (the CUDA kernel runs that
// one; cuda_test compares the two devices).
TEST(CropResize, SeparableEqualsPerPixel) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int c = trial % 2 == 0 ? 3 : 1;
    const int w = 1 + rng() % 300, h = 1 + rng() % 300;
    std::vector<uint8_t> src(static_cast<size_t>(w) * h * c);
    for (auto& v : src) v = static_cast<uint8_t>(rng() >> 24);
    ResizeJob job;
    job.pixels = src.data();
    job.width = w;
    job.height = h;
    job.stride = w * c;
    job.box.x0 = rng() % w;
    job.box.y0 = rng() % h;
    job.box.w = 1 + rng() % (w - job.box.x0);
    job.box.h = 1 + rng() % (h - job.box.y0);
    job.box.flip = trial % 3 == 0;
    const int oh = 1 + rng() % 64, ow = 1 + rng() % 64;
    std::vector<uint8_t> separable(static_cast<size_t>(oh) * ow * c), direct(separable.size());
    CropResizeCpu(job, c, oh, ow, separable.data());
    for (int y = 0; y < oh; ++y)
      for (int x = 0; x < ow; ++x) ResizePixel(job, c, oh, ow, y, x, &direct[(y * ow + x) * c]);
    ASSERT_EQ(separable, direct) << "trial " << trial;
  }
}

TEST(CropResize, SameSizeBoxCopiesAndFlipMirrors) {
  const int w = 13, h = 11, c = 3;
  std::vector<uint8_t> src(w * h * c);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37);
  ResizeJob job;
  job.pixels = src.data();
  job.width = w;
  job.height = h;
  job.stride = w * c;
  job.box = {0, 0, w, h, false};
  std::vector<uint8_t> out(src.size()), flipped(src.size());
  CropResizeCpu(job, c, h, w, out.data());
  EXPECT_EQ(out, src);
  job.box.flip = true;
  CropResizeCpu(job, c, h, w, flipped.data());
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        ASSERT_EQ(flipped[(y * w + x) * c + k], src[(y * w + (w - 1 - x)) * c + k]);
}

// A box 400,000 rows tall and one column wide: the separable pass used to keep one filtered
// row per source row (2.1 GB here); its memory now follows the output, and the bytes are
// the per-pixel kernel's. Run in a child so that its peak memory is its own.
TEST(CropResize, ATallBoxCostsWhatItsOutputCosts) {
  const int height = 400000, oh = 224, ow = 224;
  std::vector<uint8_t> pixels(height);
  for (int i = 0; i < height; ++i) pixels[i] = static_cast<uint8_t>(i * 7 + i / 1000);
  ResizeJob job;
  job.pixels = pixels.data();
  job.width = 1;
  job.height = height;
  job.stride = 1;
  job.box = {0, 0, 1, height, false};
  long baseline = 0, peak = 0;
  ASSERT_EQ(testing::RunInChild([] { return 0; }, &baseline), 0);
  const int rc = testing::RunInChild(
      [&] {
        std::vector<uint8_t> out(oh * ow), want(oh * ow);
        CropResizeCpu(job, 1, oh, ow, out.data());
        for (int y = 0; y < oh; y += 7) {
          for (int x = 0; x < ow; x += 31) ResizePixel(job, 1, oh, ow, y, x, &want[y * ow + x]);
        }
        for (int y = 0; y < oh; y += 7) {
          for (int x = 0; x < ow; x += 31) {
            if (out[y * ow + x] != want[y * ow + x]) return 3;
          }
        }
        return 0;
      },
      &peak);
  EXPECT_EQ(rc, 0) << "bytes differ from ResizePixel's";
  EXPECT_LT(peak - baseline, 64 << 10) << "peak " << peak << " KiB, baseline " << baseline;
}

}  // namespace
}  // namespace topiary::kernels
