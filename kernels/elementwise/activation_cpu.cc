#include "kernels/elementwise/activation.h"
#include "kernels/runtime/parallel.h"

namespace topiary::kernels {

void ActivationForwardCpu(const ActivationFn& p, int64_t n, const float* x, float* y) {
  ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) y[i] = ActivationOf(p, x[i]);
  });
}

void ActivationBackwardCpu(const ActivationFn& p, int64_t n, const float* x, const float* dy,
                           float* dx) {
  ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * ActivationSlope(p, x[i]);
  });
}

namespace {
// The index into b of element (row, j): the same element, or its image's channel j.
inline int64_t BIndex(int64_t row, int j, int c, int pixels_per_image) {
  return (pixels_per_image > 0 ? row / pixels_per_image : row) * c + j;
}
}  // namespace

void MulForwardCpu(int64_t rows, int c, int pixels_per_image, const float* a, const float* b,
                   float* y) {
  ParallelFor(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int j = 0; j < c; ++j)
        y[r * c + j] = a[r * c + j] * b[BIndex(r, j, c, pixels_per_image)];
    }
  });
}

void MulBackwardCpu(int64_t rows, int c, int pixels_per_image, const float* a, const float* b,
                    const float* dy, float* da, float* db) {
  if (da != nullptr) {
    ParallelFor(rows, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int j = 0; j < c; ++j) {
          da[r * c + j] = dy[r * c + j] * b[BIndex(r, j, c, pixels_per_image)];
        }
      }
    });
  }
  if (db == nullptr) return;
  if (pixels_per_image == 0) {
    ParallelFor(rows * c, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) db[i] = dy[i] * a[i];
    });
    return;
  }
  // One (image, channel) per output, summed over the image's pixels in order (in double: the
  // sums run over up to a few thousand pixels).
  const int64_t images = rows / pixels_per_image;
  ParallelFor(images, [&](int64_t n0, int64_t n1, int) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int j = 0; j < c; ++j) {
        double s = 0;
        for (int64_t p = 0; p < pixels_per_image; ++p) {
          const int64_t i = (n * pixels_per_image + p) * c + j;
          s += static_cast<double>(dy[i]) * a[i];
        }
        db[n * c + j] = static_cast<float>(s);
      }
    }
  });
}

}  // namespace topiary::kernels
