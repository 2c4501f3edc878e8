// StepRunner: runs a training step, and on a device that supports it (a GPU) captures the
// step once as a CUDA graph and replays it from then on. The first `eager_steps` calls run
// eagerly (letting cuDNN and cuBLAS finish their lazy initialization, which must not happen
// inside a capture); the next call records the step and replays it.
//
// REQUIRES: the step enqueues the same work every time, reading whatever changes between
// steps from device memory (see kernels/runtime/step_clock.h).
#ifndef TOPIARY_TRAINER_RUN_STEP_RUNNER_H_
#define TOPIARY_TRAINER_RUN_STEP_RUNNER_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "trainer/core/device.h"

namespace topiary {

class StepRunner {
 public:
  // use_graph: capture when the device can (ignored on the CPU).
  StepRunner(Device* device, std::function<absl::Status()> step, bool use_graph, int eager_steps)
      : device_(device),
        step_(std::move(step)),
        use_graph_(use_graph && device->cuda() != nullptr),
        eager_left_(eager_steps) {}

  // Enqueues one step.
  absl::Status Run();
  bool captured() const { return graph_ != nullptr; }
  // The captured step's graph nodes (kernel launches, copies, memsets), 0 when not captured.
  int64_t graph_nodes() const { return graph_ ? graph_->nodes() : 0; }

 private:
  Device* device_;
  std::function<absl::Status()> step_;
  bool use_graph_;
  int eager_left_;
  std::unique_ptr<CapturedWork> graph_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_STEP_RUNNER_H_
