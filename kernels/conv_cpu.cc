#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/conv.h"
#include "kernels/gemm.h"

namespace topiary::kernels {
namespace {

// Rows of the im2col buffer per chunk: large enough for efficient GEMMs, small enough that
// the buffer (rows x patch floats) stays within a few MB of cache-friendly memory.
constexpr int kTargetChunkRows = 4096;

int ImagesPerChunk(const ConvShape& sh) {
  const int rows_per_image = sh.ho() * sh.wo();
  return std::clamp(kTargetChunkRows / rows_per_image, 1, sh.n);
}

// cols[(i*Ho + oh)*Wo + ow, (r*S + s)*C + c] = x[n0 + i, oh*sh - ph + r, ow*sw - pw + s, c]
// (0 outside the image) for the images n0 .. n0 + count - 1.
void Im2Col(const ConvShape& sh, const float* x, int n0, int count, float* cols) {
  const int ho = sh.ho(), wo = sh.wo(), c = sh.c;
  const size_t row_len = sh.patch();
  for (int i = 0; i < count; ++i) {
    const float* img = x + static_cast<size_t>(n0 + i) * sh.h * sh.w * c;
    for (int oh = 0; oh < ho; ++oh) {
      for (int ow = 0; ow < wo; ++ow) {
        float* row = cols + (static_cast<size_t>(i) * ho * wo + oh * wo + ow) * row_len;
        for (int r = 0; r < sh.r; ++r) {
          const int ih = oh * sh.stride_h - sh.pad_h + r;
          float* dst = row + static_cast<size_t>(r) * sh.s * c;
          if (ih < 0 || ih >= sh.h) {
            std::memset(dst, 0, sizeof(float) * sh.s * c);
            continue;
          }
          for (int s = 0; s < sh.s; ++s) {
            const int iw = ow * sh.stride_w - sh.pad_w + s;
            if (iw < 0 || iw >= sh.w) {
              std::memset(dst + s * c, 0, sizeof(float) * c);
            } else {
              std::memcpy(dst + s * c, img + (static_cast<size_t>(ih) * sh.w + iw) * c,
                          sizeof(float) * c);
            }
          }
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

size_t ConvWorkspaceFloatsCpu(const ConvShape& sh) {
  if (sh.is_pointwise()) return 0;
  return static_cast<size_t>(ImagesPerChunk(sh)) * sh.ho() * sh.wo() * sh.patch();
}

void Conv2dForwardCpu(const ConvShape& sh, const float* x, const float* w, const float* bias,
                      float* y, float* workspace) {
  const int rows_per_image = sh.ho() * sh.wo();
  const int patch = sh.patch();
  if (sh.is_pointwise()) {
    SgemmCpu(false, true, sh.n * rows_per_image, sh.k, patch, 1.0f, x, patch, w, patch, 0.0f, y,
             sh.k);
  } else {
    const int chunk = ImagesPerChunk(sh);
    for (int n0 = 0; n0 < sh.n; n0 += chunk) {
      const int count = std::min(chunk, sh.n - n0);
      Im2Col(sh, x, n0, count, workspace);
      float* y0 = y + static_cast<size_t>(n0) * rows_per_image * sh.k;
      SgemmCpu(false, true, count * rows_per_image, sh.k, patch, 1.0f, workspace, patch, w,
               patch, 0.0f, y0, sh.k);
    }
  }
  if (bias != nullptr) {
    const size_t rows = static_cast<size_t>(sh.n) * rows_per_image;
    for (size_t i = 0; i < rows; ++i) {
      float* yr = y + i * sh.k;
      for (int j = 0; j < sh.k; ++j) yr[j] += bias[j];
    }
  }
}

void Conv2dBackwardDataCpu(const ConvShape& sh, const float* dy, const float* w, float* dx,
                           float* workspace) {
  const int rows_per_image = sh.ho() * sh.wo();
  const int patch = sh.patch();
  if (sh.is_pointwise()) {
    SgemmCpu(false, false, sh.n * rows_per_image, patch, sh.k, 1.0f, dy, sh.k, w, patch, 0.0f,
             dx, patch);
    return;
  }
  std::memset(dx, 0, sizeof(float) * sh.n * sh.h * sh.w * sh.c);
  const int chunk = ImagesPerChunk(sh);
  for (int n0 = 0; n0 < sh.n; n0 += chunk) {
    const int count = std::min(chunk, sh.n - n0);
    const float* dy0 = dy + static_cast<size_t>(n0) * rows_per_image * sh.k;
    SgemmCpu(false, false, count * rows_per_image, patch, sh.k, 1.0f, dy0, sh.k, w, patch, 0.0f,
             workspace, patch);
    Col2ImAdd(sh, workspace, n0, count, dx);
  }
}

void Conv2dBackwardFilterCpu(const ConvShape& sh, const float* x, const float* dy, float* dw,
                             float* dbias, float* workspace) {
  const int rows_per_image = sh.ho() * sh.wo();
  const int patch = sh.patch();
  if (sh.is_pointwise()) {
    SgemmCpu(true, false, sh.k, patch, sh.n * rows_per_image, 1.0f, dy, sh.k, x, patch, 0.0f,
             dw, patch);
  } else {
    const int chunk = ImagesPerChunk(sh);
    for (int n0 = 0; n0 < sh.n; n0 += chunk) {
      const int count = std::min(chunk, sh.n - n0);
      Im2Col(sh, x, n0, count, workspace);
      const float* dy0 = dy + static_cast<size_t>(n0) * rows_per_image * sh.k;
      SgemmCpu(true, false, sh.k, patch, count * rows_per_image, 1.0f, dy0, sh.k, workspace,
               patch, n0 == 0 ? 0.0f : 1.0f, dw, patch);
    }
  }
  if (dbias != nullptr) {
    std::memset(dbias, 0, sizeof(float) * sh.k);
    const size_t rows = static_cast<size_t>(sh.n) * rows_per_image;
    for (size_t i = 0; i < rows; ++i) {
      const float* g = dy + i * sh.k;
      for (int j = 0; j < sh.k; ++j) dbias[j] += g[j];
    }
  }
}

}  // namespace topiary::kernels
