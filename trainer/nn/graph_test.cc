// Networks as data: every zoo architecture survives DescribeModel -> JSON -> BuildModelFromGraph
// unchanged, a graph network trains like the zoo's, and hostile graphs are refused by name
// before anything is allocated.
#include "trainer/nn/graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "trainer/nn/layers.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/util/json.h"

namespace topiary {
namespace {

using topiary::v1::LayerNode;
using topiary::v1::NetworkGraph;

TEST(Graph, EveryZooArchitectureRoundTrips) {
  auto dev = MakeCpuDevice(1);
  for (const std::string& arch : ModelNames()) {
    SCOPED_TRACE(arch);
    const bool imagenet = arch == "resnet18" || arch == "resnet34" || arch == "resnet50";
    const Shape4 in = imagenet ? Shape4{1, 64, 64, 3} : Shape4{1, 28, 28, 1};
    auto zoo = BuildModel(arch, 0.5f, in, 10, dev.get());
    ASSERT_TRUE(zoo.ok()) << zoo.status();
    const NetworkGraph g = DescribeModel(**zoo);
    NetworkGraph parsed;
    ASSERT_TRUE(FromJson(ToJson(g), &parsed, "test", JsonUnknown::kRefuse).ok());
    auto rebuilt = BuildModelFromGraph(parsed, dev.get());
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
    EXPECT_EQ(DescribeModel(**rebuilt).SerializeAsString(), g.SerializeAsString());
    const auto a = (*zoo)->parameters(), b = (*rebuilt)->parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i]->layer, b[i]->layer);
      EXPECT_EQ(a[i]->value.shape(), b[i]->value.shape());
    }
    EXPECT_EQ((*rebuilt)->arch(), arch);
  }
}

// A small graph with the layers imported networks bring: grouped conv, ReLU6, concat, avg
// pooling. The same seed gives the same initial loss as the same graph built again.
NetworkGraph SmallGraph() {
  NetworkGraph g;
  g.set_arch("test:small");
  g.set_height(8);
  g.set_width(8);
  g.set_channels(2);
  g.set_classes(3);
  auto add = [&](const std::string& name, topiary::v1::NodeKind kind,
                 std::vector<std::string> inputs) {
    LayerNode* n = g.add_layers();
    n->set_name(name);
    n->set_kind(kind);
    for (auto& i : inputs) n->add_inputs(i);
    return n;
  };
  LayerNode* c = add("conv", topiary::v1::conv2d, {"input"});
  c->set_out_channels(8);
  c->set_kernel_h(3);
  c->set_kernel_w(3);
  c->set_stride(1);
  c->set_pad(1);
  add("bn", topiary::v1::batch_norm, {"conv"})->set_relu(true);
  LayerNode* dw = add("dw", topiary::v1::grouped_conv2d, {"bn"});
  dw->set_out_channels(8);
  dw->set_kernel_h(3);
  dw->set_kernel_w(3);
  dw->set_stride(2);
  dw->set_pad(1);
  dw->set_groups(8);
  dw->set_bias(true);
  add("six", topiary::v1::relu6, {"dw"});
  LayerNode* p = add("pool", topiary::v1::avg_pool, {"bn"});
  p->set_window(2);
  p->set_stride(2);
  add("cat", topiary::v1::concat, {"six", "pool"});
  add("gap", topiary::v1::global_avg_pool, {"cat"});
  add("flat", topiary::v1::flatten, {"gap"});
  add("fc", topiary::v1::linear, {"flat"})->set_out_channels(3);
  return g;
}

TEST(Graph, ImportedLayerKindsTrainOnTheCpu) {
  auto dev = MakeCpuDevice(1);
  auto model = BuildModelFromGraph(SmallGraph(), dev.get());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->value_shapes()[6].c, 16);  // the concat: 8 + 8 channels
  (*model)->Initialize(3);
  auto net = Network::Plan(model->get(), 4, true);
  ASSERT_TRUE(net.ok()) << net.status();
  for (int i = 0; i < 4 * 8 * 8 * 2; ++i) (*net)->input()[i] = static_cast<float>(i % 7) - 3;
  for (int i = 0; i < 4; ++i) (*net)->labels()[i] = i % 3;
  ASSERT_TRUE((*net)->Forward(true).ok());
  ASSERT_TRUE((*net)->Loss(0).ok());
  ASSERT_TRUE((*net)->Backward().ok());
  Parameter* dw = (*model)->FindLayer("dw")->parameter(ParamRole::kKernel);
  double norm = 0;
  for (size_t i = 0; i < dw->size(); ++i) norm += std::abs(dw->grad.data()[i]);
  EXPECT_GT(norm, 0);  // the gradient reaches the depthwise layer through concat and ReLU6
  auto metrics = (*net)->TakeMetrics();
  ASSERT_TRUE(metrics.ok());
  EXPECT_TRUE(std::isfinite(metrics->loss()));
}

// Mobile networks' layers (SiLU, a squeeze-and-excitation gate with leaky ReLU, hard
// sigmoid and mul, hard swish, sigmoid): the backward pass's weight gradients equal central
// differences of the loss, through every one of them.
TEST(Graph, MobileActivationsAndGatesBackpropagateExactly) {
  NetworkGraph g;
  g.set_arch("test:mobile");
  g.set_height(5);
  g.set_width(5);
  g.set_channels(2);
  g.set_classes(3);
  auto add = [&](const std::string& name, topiary::v1::NodeKind kind,
                 std::vector<std::string> inputs, int out = 0) {
    LayerNode* n = g.add_layers();
    n->set_name(name);
    n->set_kind(kind);
    for (auto& i : inputs) n->add_inputs(i);
    if (out > 0) {
      n->set_out_channels(out);
      if (kind == topiary::v1::conv2d) {
        n->set_kernel_h(out == 6 ? 3 : 1);
        n->set_kernel_w(out == 6 ? 3 : 1);
        n->set_stride(1);
        n->set_pad(out == 6 ? 1 : 0);
        n->set_bias(true);
      }
    }
    return n;
  };
  add("conv", topiary::v1::conv2d, {"input"}, 6);
  add("silu", topiary::v1::silu, {"conv"});
  add("squeeze", topiary::v1::global_avg_pool, {"silu"});
  add("reduce", topiary::v1::conv2d, {"squeeze"}, 4);
  add("leaky", topiary::v1::leaky_relu, {"reduce"})->set_alpha(0.1f);
  add("expand", topiary::v1::conv2d, {"leaky"}, 7);
  add("expand2", topiary::v1::conv2d, {"expand"}, 6);
  LayerNode* hs = add("gate", topiary::v1::hard_sigmoid, {"expand2"});
  hs->set_alpha(0.05f);  // a wide linear range: the gate's gradient is not clamped away
  hs->set_beta(0.5f);
  add("scaled", topiary::v1::mul, {"gate", "silu"});  // the scale first: either order
  add("hswish", topiary::v1::hard_swish, {"scaled"});
  add("sig", topiary::v1::sigmoid, {"hswish"});
  add("both", topiary::v1::mul, {"sig", "hswish"});
  add("flat", topiary::v1::flatten, {"both"});
  add("fc", topiary::v1::linear, {"flat"}, 3);
  auto dev = MakeCpuDevice(1);
  auto model = BuildModelFromGraph(g, dev.get());
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->Initialize(5);
  // Round trips as data, alpha and beta included.
  EXPECT_EQ(DescribeModel(**model).SerializeAsString(), g.SerializeAsString());
  auto net = Network::Plan(model->get(), 2, true);
  ASSERT_TRUE(net.ok()) << net.status();
  for (int i = 0; i < 2 * 5 * 5 * 2; ++i) {
    (*net)->input()[i] = static_cast<float>((i * 37) % 11) / 3 - 1.6f;
  }
  (*net)->labels()[0] = 1;
  (*net)->labels()[1] = 2;
  auto loss = [&]() -> double {
    EXPECT_TRUE((*net)->Forward(true).ok());
    EXPECT_TRUE((*net)->Loss(0).ok());
    auto m = (*net)->TakeMetrics();
    EXPECT_TRUE(m.ok());
    return m->loss_sum;
  };
  loss();
  ASSERT_TRUE((*net)->Backward().ok());
  for (const char* layer : {"conv", "reduce", "expand2"}) {
    SCOPED_TRACE(layer);
    Parameter* w = (*model)->FindLayer(layer)->parameter(ParamRole::kKernel);
    const std::vector<float> grad(w->grad.data(), w->grad.data() + w->size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < w->size(); i += 3) {
      const float keep = w->value.data()[i];
      const float h = 1e-2f;
      w->value.data()[i] = keep + h;
      const double up = loss();
      w->value.data()[i] = keep - h;
      const double down = loss();
      w->value.data()[i] = keep;
      // The loss summed over the batch of 2; the gradient is of the mean.
      const double numeric = (up - down) / (2 * h) / 2;
      worst = std::max(worst, std::abs(numeric - grad[i]));
      scale = std::max(scale, std::abs(numeric));
    }
    EXPECT_LT(worst / scale, 2e-2);
    EXPECT_GT(scale, 1e-5);  // the gradient reaches the layer (through the gate: weakly)
  }
}

// Each hostile change to a good graph is refused with a message naming what is wrong.
TEST(Graph, HostileGraphsAreRefusedByName) {
  auto dev = MakeCpuDevice(1);
  struct Case {
    const char* expect;
    std::function<void(NetworkGraph&)> change;
  };
  const std::vector<Case> cases = {
      {"no kind",
       [](NetworkGraph& g) { g.mutable_layers(3)->set_kind(topiary::v1::NODE_KIND_UNSPECIFIED); }},
      {"one this build does not know, 99",
       [](NetworkGraph& g) {
         g.mutable_layers(3)->set_kind(static_cast<topiary::v1::NodeKind>(99));
       }},
      {"input 'fc' is not 'input' or an earlier layer",
       [](NetworkGraph& g) { g.mutable_layers(1)->set_inputs(0, "fc"); }},
      {"duplicate name", [](NetworkGraph& g) { g.mutable_layers(1)->set_name("conv"); }},
      {"is not 1-200 characters", [](NetworkGraph& g) { g.mutable_layers(0)->set_name("../x"); }},
      {"out_channels = 100000000",
       [](NetworkGraph& g) { g.mutable_layers(0)->set_out_channels(100000000); }},
      {"groups = 3 does not divide", [](NetworkGraph& g) { g.mutable_layers(2)->set_groups(3); }},
      {"kernel_h = 0", [](NetworkGraph& g) { g.mutable_layers(0)->set_kernel_h(0); }},
      {"weights",
       [](NetworkGraph& g) {
         g.set_channels(64);
         g.mutable_layers(0)->set_out_channels(65536);
         g.mutable_layers(0)->set_kernel_h(31);
         g.mutable_layers(0)->set_kernel_w(31);
       }},
      {"cannot read 1 inputs",
       [](NetworkGraph& g) { g.mutable_layers(5)->mutable_inputs()->RemoveLast(); }},
      {"is not the logits", [](NetworkGraph& g) { g.mutable_layers(8)->set_out_channels(4); }},
      {"input 0x8x2", [](NetworkGraph& g) { g.set_height(0); }},
      {"epsilon", [](NetworkGraph& g) { g.mutable_layers(1)->set_epsilon(-1); }},
      {"original_out_channels = 4 is not in [out_channels = 8",
       [](NetworkGraph& g) { g.mutable_layers(0)->set_original_out_channels(4); }},
      {"original_out_channels = 3 is not in [out_channels = 0",
       [](NetworkGraph& g) { g.mutable_layers(1)->set_original_out_channels(3); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    NetworkGraph g = SmallGraph();
    c.change(g);
    auto model = BuildModelFromGraph(g, dev.get(), "file.h5");
    ASSERT_FALSE(model.ok());
    EXPECT_NE(model.status().message().find(c.expect), std::string::npos) << model.status();
    EXPECT_NE(model.status().message().find("file.h5"), std::string::npos) << model.status();
  }
  NetworkGraph parsed;
  EXPECT_FALSE(FromJson("{\"layers\": 7}", &parsed, "x", JsonUnknown::kRefuse).ok());
  EXPECT_FALSE(FromJson(std::string(17 << 20, ' '), &parsed, "x", JsonUnknown::kRefuse).ok());
}

}  // namespace
}  // namespace topiary
