#include <omp.h>

#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/runtime/parallel.h"

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

int MachineThreadLimit() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return cores * 4 > 8 ? cores * 4 : 8;
}

absl::Status CheckThreadsStart(int count) {
  std::mutex mu;
  std::condition_variable release;
  bool done = false;
  std::vector<std::thread> threads;
  std::string error;
  for (int i = 0; i < count; ++i) {
    try {
      threads.emplace_back([&] {
        std::unique_lock<std::mutex> lock(mu);
        release.wait(lock, [&] { return done; });
      });
    } catch (const std::system_error& e) {
      error = e.what();
      break;
    }
  }
  const int started = static_cast<int>(threads.size());
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  release.notify_all();
  for (std::thread& t : threads) t.join();
  if (started == count) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "device.threads: the system started %d of the %d CPU threads this run needs (%s); ask "
      "for fewer threads or CPU ranks",
      started, count, error));
}

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
