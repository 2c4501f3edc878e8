#include <algorithm>

#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/parallel.h"

namespace topiary::kernels {

void ReluForwardCpu(int64_t n, const float* x, float* y) {
  ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  });
}

void ReluBackwardCpu(int64_t n, const float* y, const float* dy, float* dx) {
  ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const float g = dy[i];  // loaded either way: a select vectorizes, a guarded load does not
      dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
  });
}

void Relu6ForwardCpu(int64_t n, const float* x, float* y) {
  ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) y[i] = std::min(std::max(x[i], 0.0f), 6.0f);
  });
}

void Relu6BackwardCpu(int64_t n, const float* y, const float* dy, float* dx) {
  ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const float g = dy[i];
      dx[i] = y[i] > 0.0f && y[i] < 6.0f ? g : 0.0f;
    }
  });
}

void ConcatChannelsCpu(int64_t rows, int width, int wide_width, int offset, const float* narrow,
                       float* wide) {
  ParallelFor(rows, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      std::copy(narrow + i * width, narrow + (i + 1) * width, wide + i * wide_width + offset);
    }
  });
}

void SplitChannelsCpu(int64_t rows, int width, int wide_width, int offset, const float* wide,
                      float* narrow) {
  ParallelFor(rows, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const float* row = wide + i * wide_width + offset;
      std::copy(row, row + width, narrow + i * width);
    }
  });
}

void AddCpu(int64_t n, const float* a, const float* b, float* y) {
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) y[i] = a[i] + b[i];
  });
}

void MeanRowsCpu(int rows, int64_t n, const float* const* src, float* dst) {
  const float scale = 1.0f / rows;
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      float s = src[0][i];
      for (int r = 1; r < rows; ++r) s += src[r][i];
      dst[i] = s * scale;
    }
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

namespace {

// da = db = (dy + dy2) where y > 0, else 0; dy2 may be null.
void AddReluBackward(int64_t n, const float* y, const float* dy, const float* dy2, float* da,
                     float* db) {
  ParallelFor(n, [&](int64_t begin, int64_t end, int) {
    float* __restrict a = da;
    float* __restrict c = db;
    for (int64_t i = begin; i < end; ++i) {
      const float d = dy2 != nullptr ? dy[i] + dy2[i] : dy[i];
      const float g = y[i] > 0.0f ? d : 0.0f;
      a[i] = g;
      c[i] = g;
    }
  });
}

}  // namespace

void AddReluBackwardCpu(int64_t n, const float* y, const float* dy, float* da, float* db) {
  AddReluBackward(n, y, dy, nullptr, da, db);
}

void AddReluBackwardSumCpu(int64_t n, const float* y, const float* dy, const float* dy2, float* da,
                           float* db) {
  AddReluBackward(n, y, dy, dy2, da, db);
}

void AddBiasCpu(int64_t rows, int c, const float* bias, float* y) {
  ParallelFor(rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = y + i * c;
      for (int j = 0; j < c; ++j) row[j] += bias[j];
    }
  });
}

void BiasGradCpu(int64_t rows, int c, const float* dy, float* db) {
  // Serial over rows: a fixed summation order, and these are small (biases appear only in
  // LeNet and linear layers).
  for (int j = 0; j < c; ++j) db[j] = 0.0f;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = dy + i * c;
    for (int j = 0; j < c; ++j) db[j] += row[j];
  }
}

int64_t CountZerosCpu(int64_t n, const float* x) {
  int64_t zeros = 0;
#pragma omp parallel for reduction(+ : zeros) schedule(static)
  for (int64_t i = 0; i < n; ++i) zeros += x[i] == 0.0f;
  return zeros;
}

}  // namespace topiary::kernels
