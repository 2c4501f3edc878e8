#include "trainer/optim/optimizer.h"

#include "kernels/elementwise/sgd.h"
#include "util/status_macros.h"

namespace topiary {

absl::StatusOr<TrainingClock> TrainingClock::Create(Device* device,
                                                    const std::vector<float>& lr_table) {
  TrainingClock c;
  c.device_ = device;
  c.lr_host_ = lr_table.empty() ? std::vector<float>{0.0f} : lr_table;
  TOPIARY_ASSIGN_OR_RETURN(auto clock, Buffer<kernels::StepClock>::Create(device, 1));
  TOPIARY_ASSIGN_OR_RETURN(auto table, Buffer<float>::Create(device, c.lr_host_.size()));
  c.clock_ = std::move(clock);
  c.lr_table_ = std::move(table);
  c.lr_table_.CopyFromHost(c.lr_host_.data());
  return c;
}

absl::Status TrainingClock::BeginEpoch(int epoch, int64_t first_step, int64_t step_in_epoch) {
  kernels::StepClock c;
  c.step = first_step + step_in_epoch;
  c.epoch_first_step = first_step;
  c.epoch = epoch;
  clock_.CopyFromHost(&c);
  return absl::OkStatus();
}

absl::Status TrainingClock::Tick(int batch) {
  if (const kernels::CudaContext* cuda = device_->cuda()) {
    return kernels::TickCuda(clock_.data(), lr_table_.data(), batch, *cuda);
  }
  kernels::TickCpu(clock_.data(), lr_table_.data(), batch);
  return absl::OkStatus();
}

SgdOptimizer::SgdOptimizer(std::vector<Parameter*> params, const topiary::v1::OptimizerSpec& spec,
                           Device* device)
    : spec_(spec), device_(device) {
  for (Parameter* p : params) {
    if (p->trainable) params_.push_back(p);
  }
  tensors_.reserve(params_.size());  // a training step allocates nothing
}

absl::Status SgdOptimizer::Step(const kernels::StepClock* clock) {
  using topiary::v1::OptimizerSpec;
  const kernels::CudaContext* cuda = device_->cuda();
  kernels::SgdParams sp;
  sp.lr = cuda ? 0.0f : clock->lr;  // on a GPU the kernel reads clock->lr itself
  sp.momentum = spec_.momentum();
  sp.nesterov = spec_.nesterov();
  sp.decoupled = spec_.weight_decay_mode() == OptimizerSpec::DECOUPLED;
  std::vector<kernels::SgdTensor>& tensors = tensors_;
  tensors.clear();
  for (Parameter* p : params_) {
    // Read each step: masks are installed and replaced between phases.
    const uint8_t* mask = p->mask.empty() ? nullptr : p->mask.data();
    tensors.push_back({p->value.data(), p->momentum.data(), p->grad.data(), mask,
                       static_cast<int64_t>(p->size()), p->decay});
  }
  if (cuda) {
    sp.weight_decay = spec_.weight_decay();
    return kernels::SgdStepCuda(sp, &clock->lr, tensors, *cuda);
  }
  for (const kernels::SgdTensor& t : tensors) {
    sp.weight_decay = t.decay ? spec_.weight_decay() : 0.0f;
    kernels::SgdStepCpu(t.n, sp, t.grad, t.mask, t.w, t.momentum_buf);
  }
  return absl::OkStatus();
}

}  // namespace topiary
