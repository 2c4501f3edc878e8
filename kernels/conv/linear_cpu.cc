#include <cstring>

#include "kernels/conv/linear.h"
#include "kernels/runtime/gemm.h"
#include "kernels/runtime/parallel.h"

namespace topiary::kernels {

// Forward and backward-data split the batch rows over the threads; backward-filter splits
// the output features (rows of dW), so no partial sums need combining.
void LinearForwardCpu(const LinearShape& sh, const float* x, const float* w, const float* bias,
                      float* y) {
  ParallelFor(sh.n, [&](int64_t b, int64_t e, int) {
    if (b == e) return;
    float* y0 = y + b * sh.out;
    SgemmCpu(false, true, static_cast<int>(e - b), sh.out, sh.in, 1.0f, x + b * sh.in, sh.in, w,
             sh.in, 0.0f, y0, sh.out);
    if (bias == nullptr) return;
    for (int64_t i = 0; i < e - b; ++i) {
      float* row = y0 + i * sh.out;
      for (int j = 0; j < sh.out; ++j) row[j] += bias[j];
    }
  });
}

void LinearBackwardDataCpu(const LinearShape& sh, const float* dy, const float* w, float* dx) {
  ParallelFor(sh.n, [&](int64_t b, int64_t e, int) {
    if (b == e) return;
    SgemmCpu(false, false, static_cast<int>(e - b), sh.in, sh.out, 1.0f, dy + b * sh.out, sh.out, w,
             sh.in, 0.0f, dx + b * sh.in, sh.in);
  });
}

void LinearBackwardFilterCpu(const LinearShape& sh, const float* x, const float* dy, float* dw,
                             float* dbias) {
  ParallelFor(sh.out, [&](int64_t b, int64_t e, int) {
    if (b == e) return;
    // dW[b:e, :] = dy[:, b:e]^T * x
    SgemmCpu(true, false, static_cast<int>(e - b), sh.in, sh.n, 1.0f, dy + b, sh.out, x, sh.in,
             0.0f, dw + b * sh.in, sh.in);
    if (dbias == nullptr) return;
    for (int64_t j = b; j < e; ++j) {
      float s = 0.0f;
      for (int i = 0; i < sh.n; ++i) s += dy[static_cast<size_t>(i) * sh.out + j];
      dbias[j] = s;
    }
  });
}

}  // namespace topiary::kernels
