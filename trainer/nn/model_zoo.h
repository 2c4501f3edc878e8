// The model zoo. Layer names are stable: they appear in checkpoints, specs and reports.
//   lenet5                       conv1, conv2, fc1, fc2, fc (max pooling, ReLU)
//   resnet20/32/44/56/110        CIFAR-style (He et al. 2016): stem.conv, then 3 stages of
//                                basic blocks (16/32/64 channels), projection shortcuts
//                                (1x1 conv + BN) where the shape changes, global pool, fc
//   resnet18/34/50               ImageNet-style: 7x7/2 stem + max pool, 4 stages (basic
//                                blocks; bottlenecks for 50), global pool, fc
// Blocks are named stage<s>.block<b>.{conv1,bn1,conv2,bn2,conv3,bn3,shortcut.conv,shortcut.bn}.
#ifndef TOPIARY_TRAINER_NN_MODEL_ZOO_H_
#define TOPIARY_TRAINER_NN_MODEL_ZOO_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/nn/model.h"
#include "trainer/spec/catalog.h"

namespace topiary {

// Builds `arch` for images of `input` (H, W, C) and `classes` outputs; `width` multiplies
// every channel count. Errors name the architecture or the layer that does not fit.
absl::StatusOr<std::unique_ptr<Model>> BuildModel(const std::string& arch, float width,
                                                  Shape4 input, int classes, Device* device);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_MODEL_ZOO_H_
