#include <cstring>

#include "kernels/gemm.h"
#include "kernels/linear.h"

namespace topiary::kernels {

void LinearForwardCpu(const LinearShape& sh, const float* x, const float* w, const float* bias,
                      float* y) {
  SgemmCpu(false, true, sh.n, sh.out, sh.in, 1.0f, x, sh.in, w, sh.in, 0.0f, y, sh.out);
  if (bias == nullptr) return;
  for (int i = 0; i < sh.n; ++i) {
    float* row = y + static_cast<size_t>(i) * sh.out;
    for (int j = 0; j < sh.out; ++j) row[j] += bias[j];
  }
}

void LinearBackwardDataCpu(const LinearShape& sh, const float* dy, const float* w, float* dx) {
  SgemmCpu(false, false, sh.n, sh.in, sh.out, 1.0f, dy, sh.out, w, sh.in, 0.0f, dx, sh.in);
}

void LinearBackwardFilterCpu(const LinearShape& sh, const float* x, const float* dy, float* dw,
                             float* dbias) {
  SgemmCpu(true, false, sh.out, sh.in, sh.n, 1.0f, dy, sh.out, x, sh.in, 0.0f, dw, sh.in);
  if (dbias == nullptr) return;
  std::memset(dbias, 0, sizeof(float) * sh.out);
  for (int i = 0; i < sh.n; ++i) {
    const float* row = dy + static_cast<size_t>(i) * sh.out;
    for (int j = 0; j < sh.out; ++j) dbias[j] += row[j];
  }
}

}  // namespace topiary::kernels
