#include "kernels/runtime/step_clock.h"

namespace topiary::kernels {

void TickCpu(StepClock* clock, const float* lr_table, int batch) {
  clock->lr = lr_table[clock->step];
  clock->batch_first = (clock->step - clock->epoch_first_step) * batch;
  clock->step += 1;
}

}  // namespace topiary::kernels
