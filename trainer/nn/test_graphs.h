// Network graphs written node by node, as `topiary import` writes them, for the channel
// tests on the CPU (trainer/nn/channels_test) and the GPU (pruning/rounds_gpu_test).
#ifndef TOPIARY_TRAINER_NN_TEST_GRAPHS_H_
#define TOPIARY_TRAINER_NN_TEST_GRAPHS_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "topiary/v1/network.pb.h"

namespace topiary::testing {

using topiary::v1::LayerNode;
using topiary::v1::NetworkGraph;

// A network graph written node by node, as `topiary import` writes one.
struct GraphBuilder {
  NetworkGraph g;
  GraphBuilder(const std::string& arch, int hw, int channels, int classes) {
    g.set_arch(arch);
    g.set_height(hw);
    g.set_width(hw);
    g.set_channels(channels);
    g.set_classes(classes);
  }
  LayerNode* operator()(const std::string& name, topiary::v1::NodeKind kind,
                        std::vector<std::string> inputs, int out = 0, int kernel = 0) {
    LayerNode* n = g.add_layers();
    n->set_name(name);
    n->set_kind(kind);
    for (auto& i : inputs) n->add_inputs(i);
    n->set_out_channels(out);
    if (kernel > 0) {
      n->set_kernel_h(kernel);
      n->set_kernel_w(kernel);
      n->set_stride(1);
      n->set_pad(kernel / 2);
    }
    return n;
  }
};

// Residual add, depthwise convolution, concat, flatten into a linear layer: one graph.
inline NetworkGraph CoupledGraph() {
  GraphBuilder add("test:coupled", 6, 2, 3);
  add("a", topiary::v1::conv2d, {"input"}, 8, 3)->set_bias(true);
  add("a_bn", topiary::v1::batch_norm, {"a"})->set_relu(true);
  add("b", topiary::v1::conv2d, {"a_bn"}, 8, 1);
  add("b_bn", topiary::v1::batch_norm, {"b"});
  add("res", topiary::v1::add, {"a_bn", "b_bn"})->set_relu(true);
  LayerNode* dw = add("dw", topiary::v1::grouped_conv2d, {"res"}, 8, 3);
  dw->set_groups(8);
  dw->set_bias(true);
  add("six", topiary::v1::relu6, {"dw"});
  add("c", topiary::v1::conv2d, {"res"}, 4, 3);
  add("cat", topiary::v1::concat, {"six", "c"});
  LayerNode* pool = add("pool", topiary::v1::max_pool, {"cat"});
  pool->set_window(2);
  pool->set_stride(2);
  add("flat", topiary::v1::flatten, {"pool"});
  add("fc1", topiary::v1::linear, {"flat"}, 6);
  add("fc1_relu", topiary::v1::relu, {"fc1"});
  add("fc", topiary::v1::linear, {"fc1_relu"}, 3);
  return add.g;
}

// MobileNetV2's inverted residual blocks as an import of PyTorch's writes them: 1x1 expand,
// depthwise 3x3 (stride 2 in the second block), 1x1 project, each with batch norm and ReLU6,
// a residual add where the shapes allow, a 1x1 head, global average pooling and the
// classifier.
inline NetworkGraph MobileNetGraph() {
  GraphBuilder add("onnx:mobilenet_v2", 8, 3, 5);
  auto conv_bn = [&](const std::string& name, const std::string& in, int out, int kernel,
                     int groups, int stride, bool relu6) {
    LayerNode* c = add(name, groups > 1 ? topiary::v1::grouped_conv2d : topiary::v1::conv2d, {in},
                       out, kernel);
    if (groups > 1) c->set_groups(groups);
    c->set_stride(stride);
    add(name + "_bn", topiary::v1::batch_norm, {name});
    if (!relu6) return name + "_bn";
    add(name + "_six", topiary::v1::relu6, {name + "_bn"});
    return name + "_six";
  };
  std::string x = conv_bn("stem", "input", 8, 3, 1, 1, true);
  for (int b = 0; b < 3; ++b) {
    const std::string p = absl::StrCat("b", b, "_");
    const int stride = b == 1 ? 2 : 1, out = b == 0 ? 8 : 12;
    std::string y = conv_bn(p + "expand", x, 24, 1, 1, 1, true);
    y = conv_bn(p + "dw", y, 24, 3, 24, stride, true);
    y = conv_bn(p + "project", y, out, 1, 1, 1, false);
    if (b != 1) {
      add(p + "add", topiary::v1::add, {x, y});
      y = p + "add";
    }
    x = y;
  }
  x = conv_bn("head", x, 16, 1, 1, 1, true);
  add("gap", topiary::v1::global_avg_pool, {x});
  add("flat", topiary::v1::flatten, {"gap"});
  add("fc", topiary::v1::linear, {"flat"}, 5);
  return add.g;
}

}  // namespace topiary::testing

#endif  // TOPIARY_TRAINER_NN_TEST_GRAPHS_H_
