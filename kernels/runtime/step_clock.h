// StepClock: what changes from one training step to the next, kept where the step runs.
// One tick at the start of each step reads the learning-rate table and sets the batch's
// position in the epoch's order; batch assembly and the SGD update read the clock. On a GPU
// the clock lives in device memory, so a captured CUDA graph replays every step unchanged.
#ifndef TOPIARY_KERNELS_RUNTIME_STEP_CLOCK_H_
#define TOPIARY_KERNELS_RUNTIME_STEP_CLOCK_H_

#include <cstdint>

#include "absl/status/status.h"

namespace topiary::kernels {

struct CudaContext;

struct StepClock {
  int64_t step = 0;              // the next optimizer step of the run (0-based)
  int64_t epoch_first_step = 0;  // the run step at which the current epoch began
  int64_t batch_first = 0;       // position in the epoch's order of this step's first image
  int32_t epoch = 0;
  float lr = 0.0f;  // this step's learning rate
};

// clock->lr = lr_table[clock->step]; clock->batch_first = (step - epoch_first_step) * batch;
// then clock->step += 1.
void TickCpu(StepClock* clock, const float* lr_table, int batch);
absl::Status TickCuda(StepClock* clock, const float* lr_table, int batch, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_STEP_CLOCK_H_
