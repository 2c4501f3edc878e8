#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/gemm.h"
#include "kernels/runtime/parallel.h"

namespace topiary::kernels {
namespace {

// Rows of the im2col buffer per chunk: large enough for efficient GEMMs, small enough that
// a thread's buffer (rows x patch floats) stays near its core's cache.
constexpr int kTargetChunkRows = 1024;

int ImagesPerChunk(const ConvShape& sh) {
  const int rows_per_image = sh.ho() * sh.wo();
  const int per_thread = (sh.n + CpuThreads() - 1) / CpuThreads();  // keep every thread busy
  return std::clamp(kTargetChunkRows / rows_per_image, 1, std::max(per_thread, 1));
}

// Per-thread slices of the workspace: the im2col buffer, then (for the filter gradient) a
// partial dW [K, patch] and a partial dbias [K].
struct ThreadScratch {
  size_t cols, dw, dbias;
  size_t total() const { return cols + dw + dbias; }
};

ThreadScratch Scratch(const ConvShape& sh) {
  const size_t cols =
      sh.is_pointwise() ? 0
                        : static_cast<size_t>(ImagesPerChunk(sh)) * sh.ho() * sh.wo() * sh.patch();
  return {cols, static_cast<size_t>(sh.k) * sh.patch(), static_cast<size_t>(sh.k)};
}

// Stride-1 convolutions whose padding is at most R-1 (all the usual ones): dx is the forward
// convolution of dy, padded by R-1-pad, with the filter flipped in R and S and transposed to
// [C, R, S, K]. That trades col2im's scattered adds (and a GEMM whose inner dimension is only
// K) for im2col's contiguous copies and a GEMM with inner dimension R*S*K.
bool UsesTransposedBackward(const ConvShape& sh) {
  return !sh.is_pointwise() && sh.stride_h == 1 && sh.stride_w == 1 && sh.pad_h <= sh.r - 1 &&
         sh.pad_w <= sh.s - 1;
}

// Floats for the transposed filter, rounded up so what follows stays 64-byte aligned.
size_t TransposedFilterFloats(const ConvShape& sh) {
  return (static_cast<size_t>(sh.k) * sh.patch() + 15) / 16 * 16;
}

// Calls f(first_image, count, thread) for each chunk, chunks spread over the threads.
template <typename F>
void ForEachChunk(const ConvShape& sh, F&& f) {
  const int chunk = ImagesPerChunk(sh);
  const int chunks = (sh.n + chunk - 1) / chunk;
  ParallelFor(chunks, [&](int64_t begin, int64_t end, int t) {
    for (int64_t c = begin; c < end; ++c) {
      const int n0 = static_cast<int>(c) * chunk;
      f(n0, std::min(chunk, sh.n - n0), t);
    }
  });
}

// Copies n floats: memcpy for long runs, a plain loop for short ones (C = 1 or 3 layers),
// where the call costs more than the copy.
inline void CopyRun(const float* src, float* dst, int n) {
  if (n >= 16) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else {
    for (int j = 0; j < n; ++j) dst[j] = src[j];
  }
}

// cols[(i*Ho + oh)*Wo + ow, (r*S + s)*C + c] = x[n0 + i, oh*sh - ph + r, ow*sw - pw + s, c]
// (0 outside the image) for the images n0 .. n0 + count - 1. The S taps of a filter row are
// contiguous in the input (whatever the stride, which only moves the window), so each
// (pixel, r) is one run of up to S*C floats.
void Im2Col(const ConvShape& sh, const float* x, int n0, int count, float* cols) {
  const int ho = sh.ho(), wo = sh.wo(), c = sh.c;
  const size_t row_len = sh.patch();
  const int tap_run = sh.s * c;
  for (int i = 0; i < count; ++i) {
    const float* img = x + static_cast<size_t>(n0 + i) * sh.h * sh.w * c;
    for (int oh = 0; oh < ho; ++oh) {
      for (int ow = 0; ow < wo; ++ow) {
        float* row = cols + (static_cast<size_t>(i) * ho * wo + oh * wo + ow) * row_len;
        const int iw0 = ow * sh.stride_w - sh.pad_w;
        // Taps s in [s_lo, s_hi) fall inside the image width.
        const int s_lo = std::max(0, -iw0);
        const int s_hi = std::min(sh.s, sh.w - iw0);
        for (int r = 0; r < sh.r; ++r) {
          const int ih = oh * sh.stride_h - sh.pad_h + r;
          float* dst = row + static_cast<size_t>(r) * tap_run;
          if (ih < 0 || ih >= sh.h || s_lo >= s_hi) {
            std::fill(dst, dst + tap_run, 0.0f);
            continue;
          }
          std::fill(dst, dst + s_lo * c, 0.0f);
          const float* src = img + (static_cast<size_t>(ih) * sh.w + iw0) * c;
          CopyRun(src + s_lo * c, dst + s_lo * c, (s_hi - s_lo) * c);
          std::fill(dst + s_hi * c, dst + tap_run, 0.0f);
        }
      }
    }
  }
}

// The adjoint of Im2Col: adds each column entry back to the input pixel it was read from.
// dx for the chunk's images must be zeroed by the caller.
void Col2ImAdd(const ConvShape& sh, const float* cols, int n0, int count, float* dx) {
  const int ho = sh.ho(), wo = sh.wo(), c = sh.c;
  const size_t row_len = sh.patch();
  for (int i = 0; i < count; ++i) {
    float* img = dx + static_cast<size_t>(n0 + i) * sh.h * sh.w * c;
    for (int oh = 0; oh < ho; ++oh) {
      for (int ow = 0; ow < wo; ++ow) {
        const float* row = cols + (static_cast<size_t>(i) * ho * wo + oh * wo + ow) * row_len;
        for (int r = 0; r < sh.r; ++r) {
          const int ih = oh * sh.stride_h - sh.pad_h + r;
          if (ih < 0 || ih >= sh.h) continue;
          for (int s = 0; s < sh.s; ++s) {
            const int iw = ow * sh.stride_w - sh.pad_w + s;
            if (iw < 0 || iw >= sh.w) continue;
            const float* src = row + (static_cast<size_t>(r) * sh.s + s) * c;
            float* dst = img + (static_cast<size_t>(ih) * sh.w + iw) * c;
            for (int j = 0; j < c; ++j) dst[j] += src[j];
          }
        }
      }
    }
  }
}

}  // namespace

ConvShape TransposedConvShape(const ConvShape& sh) {
  ConvShape t;
  t.n = sh.n;
  t.h = sh.ho();
  t.w = sh.wo();
  t.c = sh.k;
  t.k = sh.c;
  t.r = sh.r;
  t.s = sh.s;
  t.pad_h = sh.r - 1 - sh.pad_h;
  t.pad_w = sh.s - 1 - sh.pad_w;
  return t;
}

absl::Status CheckConvShape(const ConvShape& sh) {
  if (sh.n <= 0 || sh.h <= 0 || sh.w <= 0 || sh.c <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("conv input [%d, %d, %d, %d] must be positive", sh.n, sh.h, sh.w, sh.c));
  }
  if (sh.k <= 0 || sh.r <= 0 || sh.s <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("conv filter [%d, %d, %d] must be positive", sh.k, sh.r, sh.s));
  }
  if (sh.stride_h <= 0 || sh.stride_w <= 0 || sh.pad_h < 0 || sh.pad_w < 0) {
    return absl::InvalidArgumentError("conv stride must be > 0 and padding >= 0");
  }
  if (sh.h + 2 * sh.pad_h < sh.r || sh.w + 2 * sh.pad_w < sh.s) {
    return absl::InvalidArgumentError(
        absl::StrFormat("conv filter %dx%d larger than padded input %dx%d", sh.r, sh.s,
                        sh.h + 2 * sh.pad_h, sh.w + 2 * sh.pad_w));
  }
  return absl::OkStatus();
}

bool ConvLogEnabled() { return std::getenv("TOPIARY_CONV_LOG") != nullptr; }

size_t ConvWorkspaceFloatsCpu(const ConvShape& sh) {
  const size_t direct = static_cast<size_t>(CpuThreads()) * Scratch(sh).total();
  if (!UsesTransposedBackward(sh)) return direct;
  const ConvShape t = TransposedConvShape(sh);
  const size_t transposed =
      TransposedFilterFloats(sh) + static_cast<size_t>(CpuThreads()) * Scratch(t).total();
  return std::max(direct, transposed);
}

void Conv2dForwardCpu(const ConvShape& sh, const float* x, const float* w, const float* bias,
                      float* y, float* workspace) {
  const int rows_per_image = sh.ho() * sh.wo();
  const int patch = sh.patch();
  const ThreadScratch ts = Scratch(sh);
  ForEachChunk(sh, [&](int n0, int count, int t) {
    const size_t row0 = static_cast<size_t>(n0) * rows_per_image;
    const int rows = count * rows_per_image;
    const float* a = x + row0 * patch;  // pointwise: the input is already the im2col matrix
    if (!sh.is_pointwise()) {
      float* cols = workspace + t * ts.total();
      Im2Col(sh, x, n0, count, cols);
      a = cols;
    }
    float* y0 = y + row0 * sh.k;
    SgemmCpu(false, true, rows, sh.k, patch, 1.0f, a, patch, w, patch, 0.0f, y0, sh.k);
    if (bias != nullptr) {
      for (int i = 0; i < rows; ++i) {
        float* yr = y0 + static_cast<size_t>(i) * sh.k;
        for (int j = 0; j < sh.k; ++j) yr[j] += bias[j];
      }
    }
  });
}

void Conv2dBackwardDataCpu(const ConvShape& sh, const float* dy, const float* w, float* dx,
                           float* workspace) {
  const int rows_per_image = sh.ho() * sh.wo();
  const int patch = sh.patch();
  if (UsesTransposedBackward(sh)) {
    float* wt = workspace;  // wt[c, r, s, k] = w[k, R-1-r, S-1-s, c]
    for (int k = 0; k < sh.k; ++k)
      for (int r = 0; r < sh.r; ++r)
        for (int s = 0; s < sh.s; ++s)
          for (int c = 0; c < sh.c; ++c)
            wt[((static_cast<size_t>(c) * sh.r + r) * sh.s + s) * sh.k + k] =
                w[((static_cast<size_t>(k) * sh.r + (sh.r - 1 - r)) * sh.s + (sh.s - 1 - s)) *
                      sh.c +
                  c];
    Conv2dForwardCpu(TransposedConvShape(sh), dy, wt, nullptr, dx,
                     workspace + TransposedFilterFloats(sh));
    return;
  }
  const ThreadScratch ts = Scratch(sh);
  const size_t image = static_cast<size_t>(sh.h) * sh.w * sh.c;
  ForEachChunk(sh, [&](int n0, int count, int t) {
    const size_t row0 = static_cast<size_t>(n0) * rows_per_image;
    const float* dy0 = dy + row0 * sh.k;
    if (sh.is_pointwise()) {
      SgemmCpu(false, false, count * rows_per_image, patch, sh.k, 1.0f, dy0, sh.k, w, patch, 0.0f,
               dx + row0 * patch, patch);
      return;
    }
    float* cols = workspace + t * ts.total();
    SgemmCpu(false, false, count * rows_per_image, patch, sh.k, 1.0f, dy0, sh.k, w, patch, 0.0f,
             cols, patch);
    std::memset(dx + n0 * image, 0, sizeof(float) * count * image);
    Col2ImAdd(sh, cols, n0, count, dx);
  });
}

void Conv2dBackwardFilterCpu(const ConvShape& sh, const float* x, const float* dy, float* dw,
                             float* dbias, float* workspace) {
  const int rows_per_image = sh.ho() * sh.wo();
  const int patch = sh.patch();
  const ThreadScratch ts = Scratch(sh);
  const int threads = CpuThreads();
  // Each thread sums its chunks into its own partial dW (and dbias)...
  ParallelFor(threads, [&](int64_t, int64_t, int t) {
    std::memset(workspace + t * ts.total() + ts.cols, 0, sizeof(float) * (ts.dw + ts.dbias));
  });
  ForEachChunk(sh, [&](int n0, int count, int t) {
    float* base = workspace + t * ts.total();
    const size_t row0 = static_cast<size_t>(n0) * rows_per_image;
    const int rows = count * rows_per_image;
    const float* dy0 = dy + row0 * sh.k;
    const float* b = x + row0 * patch;
    if (!sh.is_pointwise()) {
      Im2Col(sh, x, n0, count, base);
      b = base;
    }
    SgemmCpu(true, false, sh.k, patch, rows, 1.0f, dy0, sh.k, b, patch, 1.0f, base + ts.cols,
             patch);
    if (dbias != nullptr) {
      float* db = base + ts.cols + ts.dw;
      for (int i = 0; i < rows; ++i) {
        const float* g = dy0 + static_cast<size_t>(i) * sh.k;
        for (int j = 0; j < sh.k; ++j) db[j] += g[j];
      }
    }
  });
  // ...and the partials are added in thread order, so the result does not depend on timing.
  const size_t n = ts.dw + (dbias != nullptr ? ts.dbias : 0);
  ParallelFor(static_cast<int64_t>(n), [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      float sum = 0.0f;
      for (int t = 0; t < threads; ++t) sum += workspace[t * ts.total() + ts.cols + i];
      if (static_cast<size_t>(i) < ts.dw) {
        dw[i] = sum;
      } else {
        dbias[i - ts.dw] = sum;
      }
    }
  });
}

}  // namespace topiary::kernels
