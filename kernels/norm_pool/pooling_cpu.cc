#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "kernels/norm_pool/pooling.h"
#include "kernels/runtime/parallel.h"

namespace topiary::kernels {
namespace {

// Calls f(oh, ow, h0, h1, w0, w1) for every output pixel with its clipped input window.
template <typename F>
void ForEachWindow(const PoolShape& sh, F f) {
  for (int oh = 0; oh < sh.ho(); ++oh) {
    const int hs = oh * sh.stride_h - sh.pad_h;
    const int h0 = std::max(hs, 0), h1 = std::min(hs + sh.r, sh.h);
    for (int ow = 0; ow < sh.wo(); ++ow) {
      const int ws = ow * sh.stride_w - sh.pad_w;
      const int w0 = std::max(ws, 0), w1 = std::min(ws + sh.s, sh.w);
      f(oh, ow, h0, h1, w0, w1);
    }
  }
}

// Calls f(n) for every image, images spread over the threads.
template <typename F>
void ForEachImage(const PoolShape& sh, F&& f) {
  ParallelFor(sh.n, [&](int64_t begin, int64_t end, int) {
    for (int64_t n = begin; n < end; ++n) f(static_cast<int>(n));
  });
}

}  // namespace

absl::Status CheckPoolShape(const PoolShape& sh) {
  if (sh.n <= 0 || sh.h <= 0 || sh.w <= 0 || sh.c <= 0 || sh.r <= 0 || sh.s <= 0 ||
      sh.stride_h <= 0 || sh.stride_w <= 0 || sh.pad_h < 0 || sh.pad_w < 0) {
    return absl::InvalidArgumentError("pool sizes and strides must be positive, padding >= 0");
  }
  if (2 * sh.pad_h > sh.r || 2 * sh.pad_w > sh.s) {
    return absl::InvalidArgumentError("pool padding must be at most half the window");
  }
  if (sh.r * sh.s > 255) {  // the GPU records a maximum's position in one byte
    return absl::InvalidArgumentError(
        absl::StrFormat("pool window %dx%d has more than 255 positions", sh.r, sh.s));
  }
  if (sh.h + 2 * sh.pad_h < sh.r || sh.w + 2 * sh.pad_w < sh.s) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pool window %dx%d larger than padded input %dx%d", sh.r, sh.s,
                        sh.h + 2 * sh.pad_h, sh.w + 2 * sh.pad_w));
  }
  return absl::OkStatus();
}

void MaxPoolForwardCpu(const PoolShape& sh, const float* x, float* y) {
  const int c = sh.c;
  ForEachImage(sh, [&](int n) {
    const float* img = x + static_cast<size_t>(n) * sh.h * sh.w * c;
    float* out = y + static_cast<size_t>(n) * sh.ho() * sh.wo() * c;
    ForEachWindow(sh, [&](int oh, int ow, int h0, int h1, int w0, int w1) {
      float* o = out + (static_cast<size_t>(oh) * sh.wo() + ow) * c;
      std::fill(o, o + c, -std::numeric_limits<float>::infinity());
      for (int ih = h0; ih < h1; ++ih) {
        for (int iw = w0; iw < w1; ++iw) {
          const float* p = img + (static_cast<size_t>(ih) * sh.w + iw) * c;
          for (int j = 0; j < c; ++j) o[j] = std::max(o[j], p[j]);
        }
      }
    });
  });
}

void MaxPoolBackwardCpu(const PoolShape& sh, const float* x, const float* y, const float* dy,
                        float* dx) {
  const int c = sh.c;
  ForEachImage(sh, [&](int n) {
    const size_t in_off = static_cast<size_t>(n) * sh.h * sh.w * c;
    const size_t out_off = static_cast<size_t>(n) * sh.ho() * sh.wo() * c;
    std::memset(dx + in_off, 0, sizeof(float) * sh.h * sh.w * c);
    ForEachWindow(sh, [&](int oh, int ow, int h0, int h1, int w0, int w1) {
      const size_t o = out_off + (static_cast<size_t>(oh) * sh.wo() + ow) * c;
      // The first position (in scan order) that holds the window's maximum gets it all.
      auto first_max = [&](int j) -> size_t {
        for (int ih = h0; ih < h1; ++ih) {
          for (int iw = w0; iw < w1; ++iw) {
            const size_t p = in_off + (static_cast<size_t>(ih) * sh.w + iw) * c + j;
            if (x[p] == y[o + j]) return p;
          }
        }
        return in_off + (static_cast<size_t>(h0) * sh.w + w0) * c +
               j;  // unreachable: y is one of them
      };
      for (int j = 0; j < c; ++j) dx[first_max(j)] += dy[o + j];
    });
  });
}

void AvgPoolForwardCpu(const PoolShape& sh, const float* x, float* y) {
  const int c = sh.c;
  const float inv = 1.0f / static_cast<float>(sh.r * sh.s);
  ForEachImage(sh, [&](int n) {
    const float* img = x + static_cast<size_t>(n) * sh.h * sh.w * c;
    float* out = y + static_cast<size_t>(n) * sh.ho() * sh.wo() * c;
    ForEachWindow(sh, [&](int oh, int ow, int h0, int h1, int w0, int w1) {
      float* o = out + (static_cast<size_t>(oh) * sh.wo() + ow) * c;
      std::fill(o, o + c, 0.0f);
      for (int ih = h0; ih < h1; ++ih) {
        for (int iw = w0; iw < w1; ++iw) {
          const float* p = img + (static_cast<size_t>(ih) * sh.w + iw) * c;
          for (int j = 0; j < c; ++j) o[j] += p[j];
        }
      }
      for (int j = 0; j < c; ++j) o[j] *= inv;
    });
  });
}

void AvgPoolBackwardCpu(const PoolShape& sh, const float* dy, float* dx) {
  const int c = sh.c;
  const float inv = 1.0f / static_cast<float>(sh.r * sh.s);
  ForEachImage(sh, [&](int n) {
    float* img = dx + static_cast<size_t>(n) * sh.h * sh.w * c;
    std::memset(img, 0, sizeof(float) * sh.h * sh.w * c);
    const float* g = dy + static_cast<size_t>(n) * sh.ho() * sh.wo() * c;
    ForEachWindow(sh, [&](int oh, int ow, int h0, int h1, int w0, int w1) {
      const float* go = g + (static_cast<size_t>(oh) * sh.wo() + ow) * c;
      for (int ih = h0; ih < h1; ++ih) {
        for (int iw = w0; iw < w1; ++iw) {
          float* p = img + (static_cast<size_t>(ih) * sh.w + iw) * c;
          for (int j = 0; j < c; ++j) p[j] += go[j] * inv;
        }
      }
    });
  });
}

void GlobalAvgPoolForwardCpu(int n, int hw, int c, const float* x, float* y) {
  const float inv = 1.0f / static_cast<float>(hw);
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      float* o = y + static_cast<size_t>(i) * c;
      std::fill(o, o + c, 0.0f);
      for (int p = 0; p < hw; ++p) {
        const float* row = x + (static_cast<size_t>(i) * hw + p) * c;
        for (int j = 0; j < c; ++j) o[j] += row[j];
      }
      for (int j = 0; j < c; ++j) o[j] *= inv;
    }
  });
}

void GlobalAvgPoolBackwardCpu(int n, int hw, int c, const float* dy, float* dx) {
  const float inv = 1.0f / static_cast<float>(hw);
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const float* g = dy + static_cast<size_t>(i) * c;
      for (int p = 0; p < hw; ++p) {
        float* row = dx + (static_cast<size_t>(i) * hw + p) * c;
        for (int j = 0; j < c; ++j) row[j] = g[j] * inv;
      }
    }
  });
}

}  // namespace topiary::kernels
