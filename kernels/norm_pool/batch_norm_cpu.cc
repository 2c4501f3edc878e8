#include <algorithm>
#include <cmath>

#include "kernels/norm_pool/batch_norm.h"
#include "kernels/runtime/parallel.h"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

// The planned workspace, carved: per-thread double partials and float block sums (2C each),
// the two double totals (2C), and 4C floats of per-channel coefficients. Doubles first, so
// they stay 8-byte aligned.
struct Scratch {
  double* part;   // [threads][2C]
  double* total;  // [2C]
  float* block;   // [threads][2C]
  float* coef;    // [4C]
};

size_t ScratchFloats(int c, int threads) {
  const size_t doubles = static_cast<size_t>(threads) * 2 * c + 2 * static_cast<size_t>(c);
  return 2 * doubles + static_cast<size_t>(threads) * 2 * c + 4 * static_cast<size_t>(c);
}

Scratch Carve(float* ws, int c, int threads) {
  Scratch s;
  s.part = reinterpret_cast<double*>(ws);
  s.total = s.part + static_cast<size_t>(threads) * 2 * c;
  s.block = reinterpret_cast<float*>(s.total + 2 * c);
  s.coef = s.block + static_cast<size_t>(threads) * 2 * c;
  return s;
}

// Per-channel sums over rows, deterministic and accurate: float sums over blocks of
// kBlockRows rows (vectorizable along the channels), added into per-thread double totals
// (M reaches 10^5..10^6 rows, where one float sum drifts), combined in thread order into
// s.total[0..C) and s.total[C..2C). f(row, a, b) adds one row to the float sums a and b.
constexpr int64_t kBlockRows = 64;

template <typename F>
void ChannelSums(int64_t m, int c, F&& f, const Scratch& s) {
  const int threads = CpuThreads();
  std::fill(s.part, s.part + static_cast<size_t>(threads) * 2 * c, 0.0);
  ParallelFor(m, [&](int64_t begin, int64_t end, int t) {
    double* pa = s.part + static_cast<size_t>(t) * 2 * c;
    double* pb = pa + c;
    float* fa = s.block + static_cast<size_t>(t) * 2 * c;
    float* fb = fa + c;
    for (int64_t i0 = begin; i0 < end; i0 += kBlockRows) {
      std::fill(fa, fa + 2 * c, 0.0f);
      const int64_t i1 = std::min(i0 + kBlockRows, end);
      for (int64_t i = i0; i < i1; ++i) f(i, fa, fb);
      for (int j = 0; j < c; ++j) {
        pa[j] += fa[j];
        pb[j] += fb[j];
      }
    }
  });
  std::fill(s.total, s.total + 2 * c, 0.0);
  for (int t = 0; t < threads; ++t) {
    const double* p = s.part + static_cast<size_t>(t) * 2 * c;
    for (int j = 0; j < 2 * c; ++j) s.total[j] += p[j];
  }
}

// The rows the statistics cover, and s.total[0, n) made global: the sums over every rank's
// rows. Without sync: this rank's.
int64_t GlobalRows(const BatchNormShape& sh, const BatchNormSync* sync) {
  return sync ? sh.m * sync->ranks() : sh.m;
}
absl::Status GlobalSums(BatchNormSync* sync, const Scratch& s, int n) {
  if (sync == nullptr) return absl::OkStatus();
  return sync->SumOverRanks(s.total, n);
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

// kRelu: the forward output y masks the incoming gradient (the fused ReLU's backward). The
// row loops load dy unconditionally and select (a load under a condition cannot be
// vectorized: it might fault), through restrict-qualified pointers; the masked passes ran
// 5x slower than the unmasked ones before.
template <bool kRelu>
absl::Status BackwardImpl(const BatchNormShape& sh, const float* x, const float* y, const float* dy,
                          const float* gamma, const float* save_mean, const float* save_inv_std,
                          float* dx, float* dgamma, float* dbeta, const Scratch& s,
                          BatchNormSync* sync) {
  const int c = sh.c;
  ChannelSums(
      sh.m, c,
      [&](int64_t i, float* __restrict a, float* __restrict b) {
        const float* __restrict xr = x + i * c;
        const float* __restrict gr = dy + i * c;
        const float* __restrict yr = kRelu ? y + i * c : nullptr;
        const float* __restrict mean = save_mean;
        const float* __restrict inv_std = save_inv_std;
        for (int j = 0; j < c; ++j) {
          const float gv = gr[j];  // loaded either way: a select, not a branch, vectorizes
          const float g = !kRelu || yr[j] > 0.0f ? gv : 0.0f;
          a[j] += g;
          b[j] += g * (xr[j] - mean[j]) * inv_std[j];
        }
      },
      s);
  // dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat))
  float* k_scale = s.coef;
  float* k_mean_dy = s.coef + c;
  float* k_mean_dyx = s.coef + 2 * c;
  for (int j = 0; j < c; ++j) {  // this rank's sums
    dbeta[j] = static_cast<float>(s.total[j]);
    dgamma[j] = static_cast<float>(s.total[c + j]);
  }
  TOPIARY_RETURN_IF_ERROR(GlobalSums(sync, s, 2 * c));
  const double inv_m = 1.0 / static_cast<double>(GlobalRows(sh, sync));
  for (int j = 0; j < c; ++j) {
    k_scale[j] = gamma[j] * save_inv_std[j];
    k_mean_dy[j] = static_cast<float>(s.total[j] * inv_m);
    k_mean_dyx[j] = static_cast<float>(s.total[c + j] * inv_m);
  }
  ParallelFor(sh.m, [&](int64_t begin, int64_t end, int) {
    const float* __restrict scale = k_scale;
    const float* __restrict mean_dy = k_mean_dy;
    const float* __restrict mean_dyx = k_mean_dyx;
    const float* __restrict mean = save_mean;
    const float* __restrict inv_std = save_inv_std;
    for (int64_t i = begin; i < end; ++i) {
      const float* __restrict xr = x + i * c;
      const float* __restrict gr = dy + i * c;
      const float* __restrict yr = kRelu ? y + i * c : nullptr;
      float* __restrict out = dx + i * c;
      for (int j = 0; j < c; ++j) {
        const float gv = gr[j];
        const float g = !kRelu || yr[j] > 0.0f ? gv : 0.0f;
        const float xhat = (xr[j] - mean[j]) * inv_std[j];
        out[j] = scale[j] * (g - mean_dy[j] - xhat * mean_dyx[j]);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

size_t BatchNormWorkspaceFloatsCpu(const BatchNormShape& sh) {
  return ScratchFloats(sh.c, CpuThreads());
}

absl::Status BatchNormForwardTrainCpu(const BatchNormShape& sh, const float* x, const float* gamma,
                                      const float* beta, float* running_mean, float* running_var,
                                      float* save_mean, float* save_inv_std, float* y,
                                      float* workspace, BatchNormSync* sync) {
  const int c = sh.c;
  const double rows = static_cast<double>(GlobalRows(sh, sync));
  const Scratch s = Carve(workspace, c, CpuThreads());
  ChannelSums(
      sh.m, c,
      [&](int64_t i, float* a, float*) {
        const float* row = x + i * c;
        for (int j = 0; j < c; ++j) a[j] += row[j];
      },
      s);
  TOPIARY_RETURN_IF_ERROR(GlobalSums(sync, s, c));
  // The mean (rounded to float: the value the second pass subtracts and the one saved for
  // the backward pass) in coef[2C..3C); scale and shift use coef[0..2C).
  float* mean_f = s.coef + 2 * c;
  for (int j = 0; j < c; ++j) mean_f[j] = static_cast<float>(s.total[j] / rows);
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
      s);
  TOPIARY_RETURN_IF_ERROR(GlobalSums(sync, s, c));
  float* scale = s.coef;
  float* shift = s.coef + c;
  for (int j = 0; j < c; ++j) {
    const double mu = static_cast<double>(mean_f[j]);
    const double var = s.total[j] / rows;
    const double inv_std = 1.0 / std::sqrt(var + sh.eps);
    save_mean[j] = mean_f[j];
    save_inv_std[j] = static_cast<float>(inv_std);
    scale[j] = static_cast<float>(gamma[j] * inv_std);
    shift[j] = static_cast<float>(beta[j] - mu * gamma[j] * inv_std);
    const double unbiased = s.total[j] / (rows - 1);
    running_mean[j] = (1.0f - sh.momentum) * running_mean[j] + sh.momentum * save_mean[j];
    running_var[j] =
        static_cast<float>((1.0 - sh.momentum) * running_var[j] + sh.momentum * unbiased);
  }
  ScaleShift(sh.m, c, sh.relu, x, scale, shift, y);
  return absl::OkStatus();
}

void BatchNormForwardEvalCpu(const BatchNormShape& sh, const float* x, const float* gamma,
                             const float* beta, const float* running_mean, const float* running_var,
                             float* y, float* workspace) {
  const int c = sh.c;
  const Scratch s = Carve(workspace, c, CpuThreads());
  float* scale = s.coef;
  float* shift = s.coef + c;
  for (int j = 0; j < c; ++j) {
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(running_var[j]) + sh.eps);
    scale[j] = static_cast<float>(gamma[j] * inv_std);
    shift[j] = static_cast<float>(beta[j] - running_mean[j] * gamma[j] * inv_std);
  }
  ScaleShift(sh.m, c, sh.relu, x, scale, shift, y);
}

absl::Status BatchNormBackwardCpu(const BatchNormShape& sh, const float* x, const float* y,
                                  const float* dy, const float* gamma, const float* save_mean,
                                  const float* save_inv_std, float* dx, float* dgamma, float* dbeta,
                                  float* workspace, BatchNormSync* sync) {
  const Scratch s = Carve(workspace, sh.c, CpuThreads());
  auto impl = sh.relu ? BackwardImpl<true> : BackwardImpl<false>;
  return impl(sh, x, y, dy, gamma, save_mean, save_inv_std, dx, dgamma, dbeta, s, sync);
}

}  // namespace topiary::kernels
