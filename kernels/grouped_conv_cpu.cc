#include <algorithm>

#include "absl/strings/str_format.h"
#include "kernels/grouped_conv.h"
#include "kernels/parallel.h"

namespace topiary::kernels {

absl::Status CheckGroupedConvShape(const GroupedConvShape& s) {
  if (auto st = CheckConvShape(s.conv); !st.ok()) return st;
  if (s.groups < 1 || s.conv.c % s.groups != 0 || s.conv.k % s.groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("groups = %d must divide both the %d input and the %d output channels",
                        s.groups, s.conv.c, s.conv.k));
  }
  return absl::OkStatus();
}

// The loops below visit, for output pixel (n, p, q), the taps (r, s) that land inside the
// image; everything else is the padding's zeros.
void GroupedConvForwardCpu(const GroupedConvShape& g, const float* x, const float* w,
                           const float* bias, float* y) {
  const ConvShape& s = g.conv;
  const int ho = s.ho(), wo = s.wo(), cg = g.cg(), kg = g.kg();
  ParallelFor(static_cast<int64_t>(s.n) * ho, [&](int64_t b, int64_t e, int) {
    for (int64_t np = b; np < e; ++np) {
      const int n = static_cast<int>(np / ho), p = static_cast<int>(np % ho);
      for (int q = 0; q < wo; ++q) {
        float* out = y + ((static_cast<int64_t>(n) * ho + p) * wo + q) * s.k;
        for (int k = 0; k < s.k; ++k) {
          const int c0 = (k / kg) * cg;
          float acc = bias ? bias[k] : 0.0f;
          for (int r = 0; r < s.r; ++r) {
            const int h = p * s.stride_h - s.pad_h + r;
            if (h < 0 || h >= s.h) continue;
            for (int t = 0; t < s.s; ++t) {
              const int x_col = q * s.stride_w - s.pad_w + t;
              if (x_col < 0 || x_col >= s.w) continue;
              const float* in = x + ((static_cast<int64_t>(n) * s.h + h) * s.w + x_col) * s.c + c0;
              const float* f = w + ((static_cast<int64_t>(k) * s.r + r) * s.s + t) * cg;
              for (int c = 0; c < cg; ++c) acc += in[c] * f[c];
            }
          }
          out[k] = acc;
        }
      }
    }
  });
}

void GroupedConvBackwardDataCpu(const GroupedConvShape& g, const float* dy, const float* w,
                                float* dx) {
  const ConvShape& s = g.conv;
  const int ho = s.ho(), wo = s.wo(), cg = g.cg(), kg = g.kg();
  // Per image: scatter each output gradient into the input pixels it read (images are
  // independent, so threads never write the same element).
  ParallelFor(s.n, [&](int64_t b, int64_t e, int) {
    for (int64_t n = b; n < e; ++n) {
      float* dxn = dx + n * s.h * s.w * s.c;
      std::fill(dxn, dxn + static_cast<int64_t>(s.h) * s.w * s.c, 0.0f);
      for (int p = 0; p < ho; ++p)
        for (int q = 0; q < wo; ++q) {
          const float* go = dy + ((n * ho + p) * wo + q) * s.k;
          for (int r = 0; r < s.r; ++r) {
            const int h = p * s.stride_h - s.pad_h + r;
            if (h < 0 || h >= s.h) continue;
            for (int t = 0; t < s.s; ++t) {
              const int x_col = q * s.stride_w - s.pad_w + t;
              if (x_col < 0 || x_col >= s.w) continue;
              float* gi = dxn + (static_cast<int64_t>(h) * s.w + x_col) * s.c;
              for (int k = 0; k < s.k; ++k) {
                const float* f = w + ((static_cast<int64_t>(k) * s.r + r) * s.s + t) * cg;
                float* gc = gi + (k / kg) * cg;
                for (int c = 0; c < cg; ++c) gc[c] += go[k] * f[c];
              }
            }
          }
        }
    }
  });
}

void GroupedConvBackwardFilterCpu(const GroupedConvShape& g, const float* x, const float* dy,
                                  float* dw, float* dbias) {
  const ConvShape& s = g.conv;
  const int ho = s.ho(), wo = s.wo(), cg = g.cg(), kg = g.kg();
  // Per output channel: each thread owns whole filters, summed over the batch in order.
  ParallelFor(s.k, [&](int64_t b, int64_t e, int) {
    for (int64_t k = b; k < e; ++k) {
      float* f = dw + k * s.r * s.s * cg;
      std::fill(f, f + static_cast<int64_t>(s.r) * s.s * cg, 0.0f);
      const int c0 = static_cast<int>(k / kg) * cg;
      float db = 0;
      for (int n = 0; n < s.n; ++n)
        for (int p = 0; p < ho; ++p)
          for (int q = 0; q < wo; ++q) {
            const float go = dy[((static_cast<int64_t>(n) * ho + p) * wo + q) * s.k + k];
            db += go;
            for (int r = 0; r < s.r; ++r) {
              const int h = p * s.stride_h - s.pad_h + r;
              if (h < 0 || h >= s.h) continue;
              for (int t = 0; t < s.s; ++t) {
                const int x_col = q * s.stride_w - s.pad_w + t;
                if (x_col < 0 || x_col >= s.w) continue;
                const float* in =
                    x + ((static_cast<int64_t>(n) * s.h + h) * s.w + x_col) * s.c + c0;
                float* fc = f + (r * s.s + t) * cg;
                for (int c = 0; c < cg; ++c) fc[c] += go * in[c];
              }
            }
          }
      if (dbias) dbias[k] = db;
    }
  });
}

}  // namespace topiary::kernels
