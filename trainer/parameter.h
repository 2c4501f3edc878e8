// Parameter: one named tensor of a layer with its gradient, optimizer state and optional
// mask. Masks are applied by projection (the optimizer zeroes masked weights and momentum
// after every update), so the forward pass reads the weights directly.
#ifndef TOPIARY_TRAINER_PARAMETER_H_
#define TOPIARY_TRAINER_PARAMETER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/device.h"
#include "trainer/tensor.h"

namespace topiary {

struct Parameter {
  std::string layer;      // e.g. "stage1.block0.conv1"
  std::string role;       // kernel | bias | gamma | beta | running_mean | running_var
  bool trainable = true;  // false for batch-norm running statistics
  bool decay = false;     // weight decay applies (conv and linear kernels)
  Tensor value;           // as stored in memory (conv kernels: [K, R, S, C])
  Tensor grad;            // trainable only
  Tensor momentum;        // trainable only
  Buffer<uint8_t> mask;   // empty: dense

  std::string full_name() const { return layer + "." + role; }
  size_t size() const { return value.size(); }
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_PARAMETER_H_
