#include "kernels/elementwise.h"
#include "kernels/parallel.h"

namespace topiary::kernels {

void ReluForwardCpu(int64_t n, const float* x, float* y) {
  ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  });
}

void ReluBackwardCpu(int64_t n, const float* y, const float* dy, float* dx) {
  ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  });
}

void AddCpu(int64_t n, const float* a, const float* b, float* y) {
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) y[i] = a[i] + b[i];
  });
}

void AddReluCpu(int64_t n, const float* a, const float* b, float* y) {
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = a[i] + b[i];
      y[i] = v > 0.0f ? v : 0.0f;
    }
  });
}

void AddReluBackwardCpu(int64_t n, const float* y, const float* dy, float* da, float* db) {
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = y[i] > 0.0f ? dy[i] : 0.0f;
      da[i] = g;
      db[i] = g;
    }
  });
}

}  // namespace topiary::kernels
