#include <cmath>
#include <vector>

#include "kernels/batch_norm.h"

namespace topiary::kernels {

// Statistics are accumulated in double: M reaches 10^5..10^6 rows, where float sums drift.
void BatchNormForwardTrainCpu(const BatchNormShape& sh, const float* x, const float* gamma,
                              const float* beta, float* running_mean, float* running_var,
                              float* save_mean, float* save_inv_std, float* y) {
  const int c = sh.c;
  std::vector<double> sum(c, 0.0), sq(c, 0.0);
  for (int64_t i = 0; i < sh.m; ++i) {
    const float* row = x + i * c;
    for (int j = 0; j < c; ++j) sum[j] += row[j];
  }
  for (int j = 0; j < c; ++j) sum[j] /= static_cast<double>(sh.m);
  for (int64_t i = 0; i < sh.m; ++i) {
    const float* row = x + i * c;
    for (int j = 0; j < c; ++j) {
      const double d = row[j] - sum[j];
      sq[j] += d * d;
    }
  }
  std::vector<float> scale(c), shift(c);
  for (int j = 0; j < c; ++j) {
    const double var = sq[j] / static_cast<double>(sh.m);
    const double inv_std = 1.0 / std::sqrt(var + sh.eps);
    save_mean[j] = static_cast<float>(sum[j]);
    save_inv_std[j] = static_cast<float>(inv_std);
    scale[j] = static_cast<float>(gamma[j] * inv_std);
    shift[j] = static_cast<float>(beta[j] - sum[j] * gamma[j] * inv_std);
    const double unbiased = sq[j] / static_cast<double>(sh.m - 1);
    running_mean[j] = (1.0f - sh.momentum) * running_mean[j] + sh.momentum * save_mean[j];
    running_var[j] = static_cast<float>((1.0 - sh.momentum) * running_var[j] +
                                        sh.momentum * unbiased);
  }
  for (int64_t i = 0; i < sh.m; ++i) {
    const float* row = x + i * c;
    float* out = y + i * c;
    for (int j = 0; j < c; ++j) out[j] = row[j] * scale[j] + shift[j];
  }
}

void BatchNormForwardEvalCpu(const BatchNormShape& sh, const float* x, const float* gamma,
                             const float* beta, const float* running_mean,
                             const float* running_var, float* y) {
  const int c = sh.c;
  std::vector<float> scale(c), shift(c);
  for (int j = 0; j < c; ++j) {
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(running_var[j]) + sh.eps);
    scale[j] = static_cast<float>(gamma[j] * inv_std);
    shift[j] = static_cast<float>(beta[j] - running_mean[j] * gamma[j] * inv_std);
  }
  for (int64_t i = 0; i < sh.m; ++i) {
    const float* row = x + i * c;
    float* out = y + i * c;
    for (int j = 0; j < c; ++j) out[j] = row[j] * scale[j] + shift[j];
  }
}

void BatchNormBackwardCpu(const BatchNormShape& sh, const float* x, const float* dy,
                          const float* gamma, const float* save_mean, const float* save_inv_std,
                          float* dx, float* dgamma, float* dbeta) {
  const int c = sh.c;
  std::vector<double> sum_dy(c, 0.0), sum_dy_xhat(c, 0.0);
  for (int64_t i = 0; i < sh.m; ++i) {
    const float* xr = x + i * c;
    const float* g = dy + i * c;
    for (int j = 0; j < c; ++j) {
      sum_dy[j] += g[j];
      sum_dy_xhat[j] += g[j] * (xr[j] - save_mean[j]) * save_inv_std[j];
    }
  }
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
  for (int64_t i = 0; i < sh.m; ++i) {
    const float* xr = x + i * c;
    const float* g = dy + i * c;
    float* out = dx + i * c;
    for (int j = 0; j < c; ++j) {
      const float xhat = (xr[j] - save_mean[j]) * save_inv_std[j];
      out[j] = k_scale[j] * (g[j] - k_mean_dy[j] - xhat * k_mean_dyx[j]);
    }
  }
}

}  // namespace topiary::kernels
