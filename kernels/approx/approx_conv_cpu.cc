#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "kernels/approx/approx_conv.h"
#include "kernels/runtime/parallel.h"

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

namespace {

// min and max of x[0..n).
std::pair<float, float> Range(const float* x, int64_t n) {
  const int threads = CpuThreads();
  float lo[kMaxCpuThreads], hi[kMaxCpuThreads];  // on the stack: the pass allocates nothing
  std::fill(lo, lo + threads, x[0]);
  std::fill(hi, hi + threads, x[0]);
  ParallelFor(n, [&](int64_t begin, int64_t end, int t) {
    for (int64_t i = begin; i < end; ++i) {
      lo[t] = std::min(lo[t], x[i]);
      hi[t] = std::max(hi[t], x[i]);
    }
  });
  return {*std::min_element(lo, lo + threads), *std::max_element(hi, hi + threads)};
}

void Quantize(const float* x, int64_t n, const QuantParams& q, uint8_t* codes, float* fake) {
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      codes[i] = QuantizeCode(x[i], q);
      if (fake != nullptr) fake[i] = DequantizeCode(codes[i], q);
    }
  });
}

// Each output channel's weight parameters (params[1 + k]), codes and code sum.
void QuantizeWeights(const ConvShape& s, const float* w, const ApproxConvOptions& o,
                     QuantParams* params, const ApproxConvWorkspace& ws, float* wq) {
  const int patch = s.patch();
  ApproxWeightParamsCpu(s, w, o, params + 1);
  ParallelFor(s.k, [&](int64_t begin, int64_t end, int) {
    for (int64_t k = begin; k < end; ++k) {
      const float* wk = w + k * patch;
      const QuantParams q = params[1 + k];
      int32_t sum = 0;
      for (int p = 0; p < patch; ++p) {
        const uint8_t code = ws.w_codes[k * patch + p] = QuantizeCode(wk[p], q);
        wq[k * patch + p] = DequantizeCode(code, q);
        sum += code;
      }
      ws.w_sum[k] = sum;
    }
  });
}

}  // namespace

void ApproxWeightParamsCpu(const ConvShape& s, const float* w, const ApproxConvOptions& o,
                           QuantParams* params) {
  const int patch = s.patch();
  // A plain pair, not a structured binding: C++17 lambdas cannot capture those.
  const bool per_channel = o.weights.scales == WeightScales::kPerChannel;
  const std::pair<float, float> whole =
      per_channel ? std::pair{0.0f, 0.0f} : Range(w, static_cast<int64_t>(s.k) * patch);
  ParallelFor(s.k, [&](int64_t begin, int64_t end, int) {
    for (int64_t k = begin; k < end; ++k) {
      std::pair<float, float> r = whole;
      if (per_channel) {
        const auto [lo, hi] = std::minmax_element(w + k * patch, w + (k + 1) * patch);
        r = {*lo, *hi};
      }
      params[k] = WeightParams(r.first, r.second, o.weights.code);
    }
  });
}

size_t ApproxConvWorkspaceBytesCpu(const ConvShape& shape) {
  return ApproxConvWorkspace(shape, nullptr, CpuThreads()).bytes;
}

void ApproxConv2dForwardCpu(const ConvShape& s, const float* x, const float* w, const float* bias,
                            const uint16_t* table, float* y, float* xq, float* wq,
                            QuantParams* params, void* workspace, const ApproxConvOptions& o) {
  const ApproxConvWorkspace ws(s, workspace, CpuThreads());
  const int64_t x_count = static_cast<int64_t>(s.n) * s.h * s.w * s.c;
  const int ho = s.ho(), wo = s.wo(), patch = s.patch();
  const auto [x_min, x_max] = Range(x, x_count);
  const QuantParams qa = params[0] =
      ActivationParams(x_min, x_max, o.running_range, o.update_range);
  Quantize(x, x_count, qa, ws.a_codes, xq);
  QuantizeWeights(s, w, o, params, ws, wq);
  const QuantParams* qw = params + 1;
  const int32_t zp_a = qa.zero_point;
  const int64_t pixels = static_cast<int64_t>(s.n) * ho * wo;
  ParallelFor(pixels, [&](int64_t begin, int64_t end, int t) {
    uint8_t* a = ws.patches + static_cast<int64_t>(t) * patch;  // padding as zp_a
    for (int64_t pix = begin; pix < end; ++pix) {
      const int n = static_cast<int>(pix / (ho * wo));
      const int oh = static_cast<int>(pix / wo % ho), ow = static_cast<int>(pix % wo);
      int32_t a_sum = 0;
      for (int r = 0; r < s.r; ++r) {
        for (int q = 0; q < s.s; ++q) {
          const int ih = oh * s.stride_h - s.pad_h + r, iw = ow * s.stride_w - s.pad_w + q;
          const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
          const uint8_t* src = ws.a_codes + ((static_cast<int64_t>(n) * s.h + ih) * s.w + iw) * s.c;
          uint8_t* dst = a + (r * s.s + q) * s.c;
          for (int c = 0; c < s.c; ++c) {
            dst[c] = inside ? src[c] : static_cast<uint8_t>(zp_a);
            a_sum += dst[c];
          }
        }
      }
      float* out = y + pix * s.k;
      for (int k = 0; k < s.k; ++k) {
        const uint8_t* wk = ws.w_codes + static_cast<int64_t>(k) * patch;
        int32_t t_sum = 0;
        for (int p = 0; p < patch; ++p) t_sum += table[(a[p] << 8) | wk[p]];
        const int64_t zp_w = qw[k].zero_point;
        const int64_t acc = static_cast<int64_t>(t_sum) - zp_w * a_sum -
                            static_cast<int64_t>(zp_a) * ws.w_sum[k] +
                            static_cast<int64_t>(patch) * zp_a * zp_w;
        out[k] = ApproxOutput(acc, qa.scale * qw[k].scale, bias ? bias[k] : 0.0f);
      }
    }
  });
}

}  // namespace topiary::kernels
