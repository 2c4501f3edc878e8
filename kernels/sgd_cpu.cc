#include "kernels/parallel.h"
#include "kernels/sgd.h"

namespace topiary::kernels {

void SgdStepCpu(int64_t n, const SgdParams& p, const float* grad, const uint8_t* mask, float* w,
                float* momentum_buf) {
  const float l2 = p.decoupled ? 0.0f : p.weight_decay;
  const float shrink = p.decoupled ? 1.0f - p.lr * p.weight_decay : 1.0f;
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      if (mask != nullptr && mask[i] == 0) {
        w[i] = 0.0f;
        momentum_buf[i] = 0.0f;
        continue;
      }
      const float g = grad[i] + l2 * w[i];
      const float buf = p.momentum * momentum_buf[i] + g;
      momentum_buf[i] = buf;
      const float d = p.nesterov ? g + p.momentum * buf : buf;
      w[i] = w[i] * shrink - p.lr * d;
    }
  });
}

}  // namespace topiary::kernels
