// Helpers for kernel tests: seeded random data, error measures, finite differences, the peak
// memory of a piece of work.
#ifndef TOPIARY_KERNELS_TEST_UTIL_H_
#define TOPIARY_KERNELS_TEST_UTIL_H_

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/conv/conv.h"
#include "kernels/norm_pool/pooling.h"
#include "kernels/sparse/block_sparse_conv.h"

namespace topiary::kernels::testing {

// Square-stride, square-padding shapes, for tables of test cases.
inline ConvShape MakeConv(int n, int h, int w, int c, int k, int r, int s, int stride, int pad) {
  ConvShape sh;
  sh.n = n;
  sh.h = h;
  sh.w = w;
  sh.c = c;
  sh.k = k;
  sh.r = r;
  sh.s = s;
  sh.stride_h = sh.stride_w = stride;
  sh.pad_h = sh.pad_w = pad;
  return sh;
}

inline PoolShape MakePool(int n, int h, int w, int c, int r, int stride, int pad) {
  PoolShape sh;
  sh.n = n;
  sh.h = h;
  sh.w = w;
  sh.c = c;
  sh.r = sh.s = r;
  sh.stride_h = sh.stride_w = stride;
  sh.pad_h = sh.pad_w = pad;
  return sh;
}

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// max |a - b| / (max |b| + tiny): error relative to the reference's scale.
inline double RelError(const std::vector<float>& a, const std::vector<double>& b) {
  double err = 0.0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

inline double RelError(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0.0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

// Central differences of a scalar function f at x, in double precision.
inline std::vector<double> NumericalGradient(const std::function<double(std::vector<double>&)>& f,
                                             std::vector<double> x, double eps = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double old = x[i];
    x[i] = old + eps;
    const double up = f(x);
    x[i] = old - eps;
    const double down = f(x);
    x[i] = old;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// How MakeBlockGrid keeps blocks.
enum class GridPattern { kRandom, kAll, kOnePerRow };

// A block-sparse test case: a shape and its block sides (input, output channels).
struct BlockConvCase {
  ConvShape shape;
  int bi, bo;
};

// The grid patterns every block-sparse test runs.
constexpr GridPattern kGridPatterns[] = {GridPattern::kRandom, GridPattern::kAll,
                                         GridPattern::kOnePerRow};

// A block grid for a shape: random (each block kept with probability 1/2), every block kept,
// or one block kept per row (row i keeps column i mod cols).
inline BlockGrid MakeBlockGrid(const ConvShape& s, int bi, int bo, GridPattern pattern,
                               uint32_t seed) {
  BlockGrid g;
  g.block_in = bi;
  g.block_out = bo;
  g.rows = (s.c + bi - 1) / bi;
  g.cols = (s.k + bo - 1) / bo;
  std::mt19937 gen(seed);
  for (int row = 0; row < g.rows; ++row) {
    for (int col = 0; col < g.cols; ++col) {
      g.kept.push_back(pattern == GridPattern::kRandom ? gen() % 2
                       : pattern == GridPattern::kAll  ? 1
                                                       : col == row % g.cols);
    }
  }
  return g;
}

// Runs `work` in a child process; returns its exit code (-1: killed) and sets `*kib` to the
// child's own peak resident memory, the process's before the fork included: compare with
// the peak of an empty `work` (a test of what something costs, not of what ran before).
inline int RunInChild(const std::function<int()>& work, long* kib) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(work());
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  *kib = usage.ru_maxrss;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace topiary::kernels::testing

#endif  // TOPIARY_KERNELS_TEST_UTIL_H_
