// SGD over a model's trainable parameters (kernels/sgd.h does the arithmetic).
#ifndef TOPIARY_TRAINER_OPTIMIZER_H_
#define TOPIARY_TRAINER_OPTIMIZER_H_

#include <vector>

#include "topiary/v1/experiment.pb.h"
#include "trainer/parameter.h"

namespace topiary {

class SgdOptimizer {
 public:
  // Weight decay applies only to parameters with decay = true (conv and linear kernels).
  SgdOptimizer(std::vector<Parameter*> params, const topiary::v1::OptimizerSpec& spec);
  // One update of every trainable parameter with learning rate lr; masks are projected.
  void Step(float lr);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  std::vector<Parameter*> params_;
  topiary::v1::OptimizerSpec spec_;
  int64_t steps_ = 0;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_OPTIMIZER_H_
