#include <omp.h>

#include <thread>

#include "kernels/parallel.h"

extern "C" void openblas_set_num_threads(int);

namespace topiary::kernels {
namespace {
int g_threads = 1;
}  // namespace

void SetCpuThreads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  g_threads = threads > kMaxCpuThreads ? kMaxCpuThreads : (threads > 0 ? threads : 1);
  openblas_set_num_threads(1);
}

int CpuThreads() { return g_threads; }

void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t, int)> f) {
  const int threads = g_threads;
  if (threads <= 1 || n <= 1) {
    f(0, n, 0);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    f(n * t / nt, n * (t + 1) / nt, t);
  }
}

}  // namespace topiary::kernels
