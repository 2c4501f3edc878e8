#include "trainer/optimizer.h"

#include "kernels/sgd.h"

namespace topiary {

SgdOptimizer::SgdOptimizer(std::vector<Parameter*> params, const topiary::v1::OptimizerSpec& spec)
    : spec_(spec) {
  for (Parameter* p : params) {
    if (p->trainable) params_.push_back(p);
  }
}

void SgdOptimizer::Step(float lr) {
  using topiary::v1::OptimizerSpec;
  for (Parameter* p : params_) {
    kernels::SgdParams sp;
    sp.lr = lr;
    sp.momentum = spec_.momentum();
    sp.nesterov = spec_.nesterov();
    sp.weight_decay = p->decay ? spec_.weight_decay() : 0.0f;
    sp.decoupled = spec_.weight_decay_mode() == OptimizerSpec::DECOUPLED;
    kernels::SgdStepCpu(static_cast<int64_t>(p->size()), sp, p->grad.data(),
                        p->mask.empty() ? nullptr : p->mask.data(), p->value.data(),
                        p->momentum.data());
  }
  ++steps_;
}

}  // namespace topiary
