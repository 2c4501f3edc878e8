#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/step_clock.h"

namespace topiary::kernels {
namespace {

__global__ void TickKernel(StepClock* clock, const float* lr_table, int batch) {
  clock->lr = lr_table[clock->step];
  clock->batch_first = (clock->step - clock->epoch_first_step) * batch;
  clock->step += 1;
}

}  // namespace

absl::Status TickCuda(StepClock* clock, const float* lr_table, int batch, const CudaContext& ctx) {
  TickKernel<<<1, 1, 0, ctx.stream>>>(clock, lr_table, batch);
  return LaunchStatus("step clock tick");
}

}  // namespace topiary::kernels
