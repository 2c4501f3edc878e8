#include <algorithm>

#include "absl/strings/str_format.h"
#include "kernels/conv/grouped_conv.h"
#include "kernels/runtime/parallel.h"

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

void GroupedConvForwardCpu(const GroupedConvShape& g, const float* x, const float* w,
                           const float* bias, float* y) {
  const ConvShape& s = g.conv;
  const int ho = s.ho(), wo = s.wo(), cg = g.cg(), kg = g.kg();
  ParallelFor(static_cast<int64_t>(s.n) * ho, [&](int64_t b, int64_t e, int) {
    for (int64_t np = b; np < e; ++np) {
      const int64_t n = np / ho;
      const int p = static_cast<int>(np % ho);
      for (int q = 0; q < wo; ++q)
        for (int k = 0; k < s.k; ++k) {
          float acc = bias ? bias[k] : 0.0f;
          for (int r = 0; r < s.r; ++r)
            for (int t = 0; t < s.s; ++t) {
              int h, col;
              if (!g.Tap(p, q, r, t, &h, &col)) continue;
              const float* in = x + g.In(n, h, col, (k / kg) * cg);
              const float* f = w + g.Filter(k, r, t, 0);
              for (int c = 0; c < cg; ++c) acc += in[c] * f[c];
            }
          y[g.Out(n, p, q, k)] = acc;
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
      std::fill(dx + g.In(n, 0, 0, 0), dx + g.In(n + 1, 0, 0, 0), 0.0f);
      for (int p = 0; p < ho; ++p)
        for (int q = 0; q < wo; ++q)
          for (int r = 0; r < s.r; ++r)
            for (int t = 0; t < s.s; ++t) {
              int h, col;
              if (!g.Tap(p, q, r, t, &h, &col)) continue;
              for (int k = 0; k < s.k; ++k) {
                const float go = dy[g.Out(n, p, q, k)];
                const float* f = w + g.Filter(k, r, t, 0);
                float* gi = dx + g.In(n, h, col, (k / kg) * cg);
                for (int c = 0; c < cg; ++c) gi[c] += go * f[c];
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
    for (int k = static_cast<int>(b); k < e; ++k) {
      std::fill(dw + g.Filter(k, 0, 0, 0), dw + g.Filter(k + 1, 0, 0, 0), 0.0f);
      const int c0 = (k / kg) * cg;
      float db = 0;
      for (int64_t n = 0; n < s.n; ++n)
        for (int p = 0; p < ho; ++p)
          for (int q = 0; q < wo; ++q) {
            const float go = dy[g.Out(n, p, q, k)];
            db += go;
            for (int r = 0; r < s.r; ++r)
              for (int t = 0; t < s.s; ++t) {
                int h, col;
                if (!g.Tap(p, q, r, t, &h, &col)) continue;
                const float* in = x + g.In(n, h, col, c0);
                float* fc = dw + g.Filter(k, r, t, 0);
                for (int c = 0; c < cg; ++c) fc[c] += go * in[c];
              }
          }
      if (dbias) dbias[k] = db;
    }
  });
}

}  // namespace topiary::kernels
