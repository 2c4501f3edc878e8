// Networks as data: a Model's graph (topiary/v1/network.proto) and the Model a graph builds.
// Checkpoints record the graph of the model they hold, so a network from anywhere (the zoo,
// `topiary import` of an ONNX file) is rebuilt from the file alone. The zoo's architectures
// are graphs built by name: DescribeModel(BuildModel(arch, ...)).
#ifndef TOPIARY_TRAINER_NN_GRAPH_H_
#define TOPIARY_TRAINER_NN_GRAPH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "topiary/v1/network.pb.h"
#include "trainer/nn/model.h"

namespace topiary {

// The name a graph gives the image, as a layer input.
inline constexpr char kGraphInput[] = "input";

// The graph of `model`: every layer in model order with its attributes and inputs.
topiary::v1::NetworkGraph DescribeModel(const Model& model);

// A model of `graph` on `device`, parameters created (not initialized). Every field is checked
// before anything is allocated (names, kinds, attribute ranges, that each input names an
// earlier layer, parameter and activation sizes), and errors name the layer and the field,
// prefixed with `what` (e.g. the checkpoint's path). `max_parameter_values` (>= 0) bounds
// the values of every parameter together (kernels, biases, batch-norm statistics): a caller
// whose weights come from a file passes what the file holds, so that a small file never
// makes a large model (each layer is checked before its parameters are allocated).
absl::StatusOr<std::unique_ptr<Model>> BuildModelFromGraph(const topiary::v1::NetworkGraph& graph,
                                                           Device* device,
                                                           const std::string& what = "network",
                                                           int64_t max_parameter_values = -1);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_GRAPH_H_
