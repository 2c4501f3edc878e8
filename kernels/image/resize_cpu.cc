#include <algorithm>
#include <vector>

#include "kernels/image/resize.h"
#include "kernels/image/resize_impl.h"

namespace topiary::kernels {
namespace {

// One axis's filters, weights computed once per image instead of once per pixel: output o
// reads taps first[o] .. first[o] + count[o] - 1 with weights[offset[o] + j], summing to sum[o].
struct AxisTable {
  std::vector<int> first, count, offset;
  std::vector<int> weights;
  std::vector<int64_t> sum;
  AxisTable(int out, int start, int len, int size, bool flip) {
    for (int o = 0; o < out; ++o) {
      // A flipped output position o reads the filter of position out - 1 - o.
      const AxisFilter f(flip ? out - 1 - o : o, out, start, len, size);
      first.push_back(f.first);
      count.push_back(f.last - f.first + 1);
      offset.push_back(static_cast<int>(weights.size()));
      int64_t s = 0;
      for (int i = f.first; i <= f.last; ++i) {
        weights.push_back(f.Weight(i));
        s += weights.back();
      }
      sum.push_back(s);
    }
  }
};

}  // namespace

// Separable: every source row the box reaches is filtered horizontally once and added, with
// its weight, to each output row whose taps include it. Memory follows the output (an
// accumulator per output pixel and one filtered row), not the box: a box a million rows tall
// costs time, not gigabytes. The integer sums are the per-pixel kernel's (ResizePixel, which
// the CUDA twin runs) in another order, so the bytes are the same.
void CropResizeCpu(const ResizeJob& job, int c, int out_h, int out_w, uint8_t* out) {
  const CropBox& b = job.box;
  const AxisTable xs(out_w, b.x0, b.w, job.width, b.flip);
  const AxisTable ys(out_h, b.y0, b.h, job.height, false);
  const int row_len = out_w * c;
  std::vector<int64_t> acc(static_cast<size_t>(out_h) * row_len, 0);
  std::vector<int64_t> filtered(row_len);
  // The output rows reading source row r are consecutive: taps move down with y.
  int y_lo = 0;
  const int row0 = ys.first.front(), row1 = ys.first.back() + ys.count.back() - 1;
  for (int r = row0; r <= row1; ++r) {
    while (y_lo < out_h && ys.first[y_lo] + ys.count[y_lo] <= r) ++y_lo;
    if (y_lo == out_h || ys.first[y_lo] > r) continue;  // no output row reads it
    const uint8_t* src = job.pixels + static_cast<int64_t>(r) * job.stride;
    std::fill(filtered.begin(), filtered.end(), 0);
    for (int x = 0; x < out_w; ++x) {
      const int* w = xs.weights.data() + xs.offset[x];
      const uint8_t* p = src + static_cast<int64_t>(xs.first[x]) * c;
      for (int j = 0; j < xs.count[x]; ++j) {
        for (int k = 0; k < c; ++k) {
          filtered[x * c + k] += static_cast<int64_t>(w[j]) * p[j * c + k];
        }
      }
    }
    for (int y = y_lo; y < out_h && ys.first[y] <= r; ++y) {
      if (ys.first[y] + ys.count[y] <= r) continue;
      const int64_t w = ys.weights[ys.offset[y] + (r - ys.first[y])];
      int64_t* dst = acc.data() + static_cast<size_t>(y) * row_len;
      for (int i = 0; i < row_len; ++i) dst[i] += w * filtered[i];
    }
  }
  uint8_t* dst = out + static_cast<int64_t>(job.out_index) * out_h * out_w * c;
  for (int y = 0; y < out_h; ++y) {
    const int64_t* a = acc.data() + static_cast<size_t>(y) * row_len;
    for (int x = 0; x < out_w; ++x) {
      const int64_t denom = ys.sum[y] * xs.sum[x];
      for (int k = 0; k < c; ++k) *dst++ = static_cast<uint8_t>((a[x * c + k] + denom / 2) / denom);
    }
  }
}

}  // namespace topiary::kernels
