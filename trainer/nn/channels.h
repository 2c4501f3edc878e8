// Channels of a network as data: which output channels must be removed together (dependency
// groups, from the network graph alone), and the smaller network that removing them leaves
// (compaction: the graph with the smaller widths, every parameter sliced).
//
// A channel is born at a convolution or linear layer (its producer: a row of the kernel and
// of the bias) and travels unchanged through batch norm, ReLU and pooling (which hold a
// per-channel parameter or none), to the layers that read it (a column of their kernels).
// Couplings tie channels of different producers: a residual add ties channel i of both its
// inputs, a depthwise convolution ties its output channel i to its input channel i, a concat
// places its inputs' channels side by side, and a flatten spreads each channel over the
// positions of its image. Channels that are tied form one *channel class*: removing it removes
// every producer's row and every reader's column at once, so the network stays well formed and
// computes what it computed with those channels zeroed. Classes born at the same producers are
// one *dependency group* (e.g. the 64 channels of a ResNet stage's residual stream), the unit
// a pruning target applies to.
//
// Some channels cannot go: the image's, the logits', and those a coupling this code does not
// model ties (a grouped convolution that is not depthwise); their group says why.
#ifndef TOPIARY_TRAINER_NN_CHANNELS_H_
#define TOPIARY_TRAINER_NN_CHANNELS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/network.pb.h"
#include "trainer/nn/model.h"

namespace topiary {

// One output channel of a producer layer: graph.layers(layer), its kernel's row `channel`.
struct ChannelRow {
  int layer = 0;
  int channel = 0;
};

// Channels removed together: their producers' rows (one per producer the class was born at or
// tied to; a depthwise convolution's row is one of them).
struct ChannelClass {
  std::vector<ChannelRow> rows;
};

// Channel classes born at the same producers.
struct DependencyGroup {
  std::string name;          // the first producer's layer name
  std::vector<int> layers;   // the producers (graph layer indices), in graph order
  std::vector<int> classes;  // indices into ChannelGroups::classes
  std::string fixed;         // why no channel of the group may go; empty: prunable
};

struct ChannelGroups {
  std::vector<ChannelClass> classes;
  std::vector<DependencyGroup> groups;
  // Per value of the model (Model::value_shapes: 0 the image, then each layer's output), per
  // channel: the class of that channel (-1: the image's channels, which belong to no class).
  std::vector<std::vector<int>> value_classes;
};

// Channels to remove from a network: its groups and one flag per class.
struct ChannelCut {
  ChannelGroups groups;
  std::vector<bool> remove;
};

// The channel classes and dependency groups of `model` (its graph and value shapes). Errors
// name the layer.
absl::StatusOr<ChannelGroups> FindChannelGroups(const Model& model);

// `model`'s graph (DescribeModel) with the channel classes marked in `remove` (one flag per
// class of `groups`, found on this model) taken out: every producer's out_channels (and a
// depthwise convolution's groups) made smaller. Refused, naming the layer or group, where a
// layer would keep no channel or a removed class is in a fixed group.
absl::StatusOr<topiary::v1::NetworkGraph> CompactGraph(const Model& model,
                                                       const ChannelGroups& groups,
                                                       const std::vector<bool>& remove);

// A model of the compacted graph on `model`'s device holding `model`'s parameters with the
// removed channels' rows and columns taken out: values, momentum, masks (a block or N:M mask
// stays one where the smaller kernel keeps its structure, else it becomes an element mask with
// the same zeros) and every non-channel parameter (an
// approximate convolution's activation range) copied as they are. `prepare`, when set, is
// called on the new model before the copy: what the run applied to the original (approximate
// convolutions, sampled gradients) is applied again, so the parameters it adds exist.
absl::StatusOr<std::unique_ptr<Model>> CompactModel(
    const Model& model, const ChannelGroups& groups, const std::vector<bool>& remove,
    const std::function<absl::Status(Model*)>& prepare = nullptr);

// The multiply-adds of one image through `model`'s convolutions and linear layers.
int64_t MultiplyAdds(const Model& model);
// ... through the network before channel pruning narrowed it (every layer at its
// original_out_channels) ...
int64_t DenseMultiplyAdds(const Model& model);
// ... and through the network CompactModel(model, groups, remove) would make.
int64_t MultiplyAdds(const Model& model, const ChannelGroups& groups,
                     const std::vector<bool>& remove);

// Per channel class: the multiply-adds of one image that removing it alone saves (its
// producers' rows, its readers' columns).
std::vector<int64_t> ClassMultiplyAdds(const Model& model, const ChannelGroups& groups);

// Zeroes, in place, every parameter that makes a removed class's channel: its producers'
// kernel rows and biases and the scale and shift of each batch norm it passes, so that the
// channel is 0 wherever it travels. The network then computes what CompactModel's computes
// (the reference the compaction is checked against).
void ZeroChannels(Model* model, const ChannelGroups& groups, const std::vector<bool>& remove);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_CHANNELS_H_
