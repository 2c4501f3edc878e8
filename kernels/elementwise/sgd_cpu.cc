#include "kernels/elementwise/sgd.h"
#include "kernels/elementwise/sgd_impl.h"
#include "kernels/runtime/parallel.h"

namespace topiary::kernels {

void SgdStepCpu(int64_t n, const SgdParams& p, const float* grad, const uint8_t* mask, float* w,
                float* momentum_buf) {
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      SgdUpdate(p, p.lr, grad[i], mask != nullptr && mask[i] == 0, w[i], momentum_buf[i]);
    }
  });
}

}  // namespace topiary::kernels
