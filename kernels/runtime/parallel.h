// CPU parallelism for the kernels: OpenMP over static, contiguous partitions. The partition
// depends only on the range and the thread count, and every reduction combines per-thread
// partial results in thread order, so results are bit-identical from run to run for a given
// thread count. BLAS itself runs single-threaded inside each partition: OpenBLAS's own
// threads spin and yield on the tall, skinny GEMMs of small convolutions.
#ifndef TOPIARY_KERNELS_RUNTIME_PARALLEL_H_
#define TOPIARY_KERNELS_RUNTIME_PARALLEL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace topiary::kernels {

// Threads the CPU kernels use (0: all cores), at most kMaxCpuThreads (kernels may keep
// per-thread partial results on the stack). Call before planning networks: workspace sizes
// depend on it.
constexpr int kMaxCpuThreads = 1024;
void SetCpuThreads(int threads);
int CpuThreads();

// The most CPU threads a run may ask for on this machine, all ranks together: 4 per core, at
// least 8. More only oversubscribes the cores, and on a small machine the system may refuse
// to start them.
int MachineThreadLimit();

// Starts `count` threads that all run at once, then ends them: RESOURCE_EXHAUSTED naming how
// many started when the system refuses one. Asked before OpenMP starts its teams, because
// libgomp aborts the whole process (a daemon with every experiment) when it cannot.
absl::Status CheckThreadsStart(int count);

// Calls f(begin, end, thread) for CpuThreads() contiguous slices of [0, n) in parallel
// (slices may be empty) and returns when all are done.
// FunctionRef, not std::function: no allocation per call inside the training step.
void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t, int)> f);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_PARALLEL_H_
