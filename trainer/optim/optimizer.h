// SGD over a model's trainable parameters (kernels/elementwise/sgd.h does the arithmetic), and the
// training clock that tells it each step's learning rate.
#ifndef TOPIARY_TRAINER_OPTIM_OPTIMIZER_H_
#define TOPIARY_TRAINER_OPTIM_OPTIMIZER_H_

#include <vector>

#include "kernels/elementwise/sgd.h"
#include "kernels/runtime/step_clock.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/core/parameter.h"

namespace topiary {

// The step clock (kernels/runtime/step_clock.h) in the device's memory, with the learning rate of
// every step of the run uploaded once.
class TrainingClock {
 public:
  static absl::StatusOr<TrainingClock> Create(Device* device, const std::vector<float>& lr_table);
  // Starts epoch `epoch`, whose first optimizer step is `first_step`, at its step
  // `step_in_epoch` (non-zero when a run resumes inside an epoch). Waits for the device.
  absl::Status BeginEpoch(int epoch, int64_t first_step, int64_t step_in_epoch = 0);
  // Enqueues the tick that starts a step of `batch` images.
  absl::Status Tick(int batch);
  // The clock, in device memory (host memory on the CPU).
  const kernels::StepClock* clock() const { return clock_.data(); }
  // The learning rate of run step `step` (for reports).
  float lr(int64_t step) const { return lr_host_[std::min<size_t>(step, lr_host_.size() - 1)]; }

 private:
  Device* device_ = nullptr;
  Buffer<kernels::StepClock> clock_;
  Buffer<float> lr_table_;
  std::vector<float> lr_host_;
};

class SgdOptimizer {
 public:
  // Weight decay applies only to parameters with decay = true (conv and linear kernels).
  SgdOptimizer(std::vector<Parameter*> params, const topiary::v1::OptimizerSpec& spec,
               Device* device);
  // One update of every trainable parameter with the clock's learning rate (read where the
  // clock lives, so a captured step replays correctly); masks are projected.
  absl::Status Step(const kernels::StepClock* clock);

 private:
  std::vector<Parameter*> params_;
  topiary::v1::OptimizerSpec spec_;
  Device* device_;
  std::vector<kernels::SgdTensor> tensors_;  // this step's tensors (capacity kept)
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_OPTIM_OPTIMIZER_H_
