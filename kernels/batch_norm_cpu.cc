#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/batch_norm.h"
#include "kernels/parallel.h"

namespace topiary::kernels {
namespace {

// Per-channel sums over rows, deterministic and accurate: float sums over blocks of
// kBlockRows rows (vectorizable along the channels), added into per-thread double totals
// (M reaches 10^5..10^6 rows, where one float sum drifts), combined in thread order.
// f(row, a, b) adds one row's contribution to the float accumulators a[C] and b[C].
constexpr int64_t kBlockRows = 64;

template <typename F>
void ChannelSums(int64_t m, int c, F&& f, std::vector<double>* a, std::vector<double>* b) {
  const int threads = CpuThreads();
  std::vector<double> part(static_cast<size_t>(threads) * 2 * c, 0.0);
  ParallelFor(m, [&](int64_t begin, int64_t end, int t) {
    double* pa = part.data() + static_cast<size_t>(t) * 2 * c;
    double* pb = pa + c;
    std::vector<float> fa(c), fb(c);
    for (int64_t i0 = begin; i0 < end; i0 += kBlockRows) {
      std::fill(fa.begin(), fa.end(), 0.0f);
      std::fill(fb.begin(), fb.end(), 0.0f);
      const int64_t i1 = std::min(i0 + kBlockRows, end);
      for (int64_t i = i0; i < i1; ++i) f(i, fa.data(), fb.data());
      for (int j = 0; j < c; ++j) {
        pa[j] += fa[j];
        pb[j] += fb[j];
      }
    }
  });
  a->assign(c, 0.0);
  b->assign(c, 0.0);
  for (int t = 0; t < threads; ++t) {
    const double* pa = part.data() + static_cast<size_t>(t) * 2 * c;
    for (int j = 0; j < c; ++j) {
      (*a)[j] += pa[j];
      (*b)[j] += pa[c + j];
    }
  }
}

// y = x * scale + shift per channel (then max(0, .) with relu), rows in parallel.
void ScaleShift(int64_t m, int c, bool relu, const float* x, const float* scale, const float* shift,
                float* y) {
  ParallelFor(m, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = x + i * c;
      float* out = y + i * c;
      if (relu) {
        for (int j = 0; j < c; ++j) out[j] = std::max(row[j] * scale[j] + shift[j], 0.0f);
      } else {
        for (int j = 0; j < c; ++j) out[j] = row[j] * scale[j] + shift[j];
      }
    }
  });
}

}  // namespace

void BatchNormForwardTrainCpu(const BatchNormShape& sh, const float* x, const float* gamma,
                              const float* beta, float* running_mean, float* running_var,
                              float* save_mean, float* save_inv_std, float* y) {
  const int c = sh.c;
  std::vector<double> sum, unused, sq;
  ChannelSums(
      sh.m, c,
      [&](int64_t i, float* a, float*) {
        const float* row = x + i * c;
        for (int j = 0; j < c; ++j) a[j] += row[j];
      },
      &sum, &unused);
  std::vector<double> mean(c);
  std::vector<float> mean_f(c);
  for (int j = 0; j < c; ++j) {
    mean[j] = sum[j] / static_cast<double>(sh.m);
    mean_f[j] = static_cast<float>(mean[j]);
  }
  // Two passes (mean, then squared deviations): no cancellation for large means.
  ChannelSums(
      sh.m, c,
      [&](int64_t i, float* a, float*) {
        const float* row = x + i * c;
        for (int j = 0; j < c; ++j) {
          const float d = row[j] - mean_f[j];
          a[j] += d * d;
        }
      },
      &sq, &unused);
  std::vector<float> scale(c), shift(c);
  for (int j = 0; j < c; ++j) {
    const double var = sq[j] / static_cast<double>(sh.m);
    const double inv_std = 1.0 / std::sqrt(var + sh.eps);
    save_mean[j] = static_cast<float>(mean[j]);
    save_inv_std[j] = static_cast<float>(inv_std);
    scale[j] = static_cast<float>(gamma[j] * inv_std);
    shift[j] = static_cast<float>(beta[j] - mean[j] * gamma[j] * inv_std);
    const double unbiased = sq[j] / static_cast<double>(sh.m - 1);
    running_mean[j] = (1.0f - sh.momentum) * running_mean[j] + sh.momentum * save_mean[j];
    running_var[j] =
        static_cast<float>((1.0 - sh.momentum) * running_var[j] + sh.momentum * unbiased);
  }
  ScaleShift(sh.m, c, sh.relu, x, scale.data(), shift.data(), y);
}

void BatchNormForwardEvalCpu(const BatchNormShape& sh, const float* x, const float* gamma,
                             const float* beta, const float* running_mean, const float* running_var,
                             float* y) {
  const int c = sh.c;
  std::vector<float> scale(c), shift(c);
  for (int j = 0; j < c; ++j) {
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(running_var[j]) + sh.eps);
    scale[j] = static_cast<float>(gamma[j] * inv_std);
    shift[j] = static_cast<float>(beta[j] - running_mean[j] * gamma[j] * inv_std);
  }
  ScaleShift(sh.m, c, sh.relu, x, scale.data(), shift.data(), y);
}

namespace {

// kRelu: the forward output y masks the incoming gradient (the fused ReLU's backward).
template <bool kRelu>
void BackwardImpl(const BatchNormShape& sh, const float* x, const float* y, const float* dy,
                  const float* gamma, const float* save_mean, const float* save_inv_std, float* dx,
                  float* dgamma, float* dbeta) {
  const int c = sh.c;
  auto grad = [&](int64_t k) { return (!kRelu || y[k] > 0.0f) ? dy[k] : 0.0f; };
  std::vector<double> sum_dy, sum_dy_xhat;
  ChannelSums(
      sh.m, c,
      [&](int64_t i, float* a, float* b) {
        const float* xr = x + i * c;
        for (int j = 0; j < c; ++j) {
          const float g = grad(i * c + j);
          a[j] += g;
          b[j] += g * (xr[j] - save_mean[j]) * save_inv_std[j];
        }
      },
      &sum_dy, &sum_dy_xhat);
  // dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat))
  std::vector<float> k_scale(c), k_mean_dy(c), k_mean_dyx(c);
  const double inv_m = 1.0 / static_cast<double>(sh.m);
  for (int j = 0; j < c; ++j) {
    dbeta[j] = static_cast<float>(sum_dy[j]);
    dgamma[j] = static_cast<float>(sum_dy_xhat[j]);
    k_scale[j] = gamma[j] * save_inv_std[j];
    k_mean_dy[j] = static_cast<float>(sum_dy[j] * inv_m);
    k_mean_dyx[j] = static_cast<float>(sum_dy_xhat[j] * inv_m);
  }
  ParallelFor(sh.m, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xr = x + i * c;
      float* out = dx + i * c;
      for (int j = 0; j < c; ++j) {
        const float xhat = (xr[j] - save_mean[j]) * save_inv_std[j];
        out[j] = k_scale[j] * (grad(i * c + j) - k_mean_dy[j] - xhat * k_mean_dyx[j]);
      }
    }
  });
}

}  // namespace

void BatchNormBackwardCpu(const BatchNormShape& sh, const float* x, const float* y, const float* dy,
                          const float* gamma, const float* save_mean, const float* save_inv_std,
                          float* dx, float* dgamma, float* dbeta) {
  if (sh.relu) {
    BackwardImpl<true>(sh, x, y, dy, gamma, save_mean, save_inv_std, dx, dgamma, dbeta);
  } else {
    BackwardImpl<false>(sh, x, y, dy, gamma, save_mean, save_inv_std, dx, dgamma, dbeta);
  }
}

}  // namespace topiary::kernels
