#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/approx_conv.h"
#include "kernels/parallel.h"

namespace topiary::kernels {

absl::Status CheckApproxConvShape(const ConvShape& s) {
  if (auto st = CheckConvShape(s); !st.ok()) return st;
  if (s.patch() > kMaxApproxPatch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "an approximate convolution's patch (R*S*C = %d) may be at most %d: longer table sums "
        "could overflow int32",
        s.patch(), kMaxApproxPatch));
  }
  if (static_cast<int64_t>(s.n) * s.h * s.w * s.c >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        "an approximate convolution's input batch must have fewer than 2^31 elements");
  }
  return absl::OkStatus();
}

void MinMaxCpu(const float* x, int64_t n, float* min, float* max) {
  const int threads = CpuThreads();
  std::vector<float> lo(threads, x[0]), hi(threads, x[0]);
  ParallelFor(n, [&](int64_t begin, int64_t end, int t) {
    for (int64_t i = begin; i < end; ++i) {
      lo[t] = std::min(lo[t], x[i]);
      hi[t] = std::max(hi[t], x[i]);
    }
  });
  *min = *std::min_element(lo.begin(), lo.end());
  *max = *std::max_element(hi.begin(), hi.end());
}

void QuantizeCpu(const float* x, int64_t n, const QuantParams& q, uint8_t* codes, float* fake) {
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      codes[i] = QuantizeCode(x[i], q);
      if (fake != nullptr) fake[i] = DequantizeCode(codes[i], q);
    }
  });
}

void ApproxConv2dForwardCpu(const ConvShape& s, const uint8_t* a_codes, const uint8_t* w_codes,
                            const uint16_t* table, const QuantParams& qa, const QuantParams& qw,
                            const float* bias, float* y) {
  const int ho = s.ho(), wo = s.wo(), patch = s.patch();
  const int32_t zp_a = qa.zero_point, zp_w = qw.zero_point;
  const float scale_aw = qa.scale * qw.scale;
  // Per output channel: the sum of its weight codes over the patch.
  std::vector<int32_t> w_sum(s.k, 0);
  for (int k = 0; k < s.k; ++k) {
    for (int p = 0; p < patch; ++p) w_sum[k] += w_codes[static_cast<int64_t>(k) * patch + p];
  }
  const int64_t pixels = static_cast<int64_t>(s.n) * ho * wo;
  ParallelFor(pixels, [&](int64_t begin, int64_t end, int) {
    std::vector<uint8_t> a(patch);  // this pixel's receptive field, padding as zp_a
    for (int64_t pix = begin; pix < end; ++pix) {
      const int n = static_cast<int>(pix / (ho * wo));
      const int oh = static_cast<int>(pix / wo % ho), ow = static_cast<int>(pix % wo);
      int32_t a_sum = 0;
      for (int r = 0; r < s.r; ++r) {
        for (int q = 0; q < s.s; ++q) {
          const int ih = oh * s.stride_h - s.pad_h + r, iw = ow * s.stride_w - s.pad_w + q;
          const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
          const uint8_t* src = a_codes + ((static_cast<int64_t>(n) * s.h + ih) * s.w + iw) * s.c;
          uint8_t* dst = a.data() + (r * s.s + q) * s.c;
          for (int c = 0; c < s.c; ++c) {
            dst[c] = inside ? src[c] : static_cast<uint8_t>(zp_a);
            a_sum += dst[c];
          }
        }
      }
      float* out = y + pix * s.k;
      for (int k = 0; k < s.k; ++k) {
        const uint8_t* w = w_codes + static_cast<int64_t>(k) * patch;
        int32_t t_sum = 0;
        for (int p = 0; p < patch; ++p) t_sum += table[(a[p] << 8) | w[p]];
        const int64_t acc = static_cast<int64_t>(t_sum) - static_cast<int64_t>(zp_w) * a_sum -
                            static_cast<int64_t>(zp_a) * w_sum[k] +
                            static_cast<int64_t>(patch) * zp_a * zp_w;
        out[k] = ApproxOutput(acc, scale_aw, bias ? bias[k] : 0.0f);
      }
    }
  });
}

}  // namespace topiary::kernels
