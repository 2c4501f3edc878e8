// Networks as data: every zoo architecture survives DescribeModel -> JSON -> BuildModelFromGraph
// unchanged, a graph network trains like the zoo's, and hostile graphs are refused by name
// before anything is allocated.
#include "trainer/nn/graph.h"

#include <gtest/gtest.h>

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
