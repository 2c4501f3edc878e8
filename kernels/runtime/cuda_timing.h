// Timing work on a CUDA stream, for choosing among kernels at plan time. Declared apart from
// cuda_context.h so that code built without the CUDA toolkit (the trainer's CPU-only builds)
// can call it; there it reports that CUDA is unavailable.
#ifndef TOPIARY_KERNELS_RUNTIME_CUDA_TIMING_H_
#define TOPIARY_KERNELS_RUNTIME_CUDA_TIMING_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace topiary::kernels {

struct CudaContext;

// Mean milliseconds of run() on ctx's stream over `runs` calls after one warm-up call (which
// also surfaces a failing run as its error; warmup = false times from the first call). Must
// not be called while the stream is being captured into a CUDA graph.
absl::StatusOr<float> TimeOnStream(const std::function<absl::Status()>& run, const CudaContext& ctx,
                                   int runs = 3, bool warmup = true);

// As TimeOnStream, but after the warm-up call the `runs` calls are captured into a CUDA graph
// and the graph's replay is timed: what a captured training step pays for them, without the
// host's launch overhead (which dominates small convolutions launched one by one).
absl::StatusOr<float> TimeCaptured(const std::function<absl::Status()>& run, const CudaContext& ctx,
                                   int runs = 10);

// Whether ctx's stream is being captured into a CUDA graph (false without CUDA).
bool StreamCapturing(const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_CUDA_TIMING_H_
