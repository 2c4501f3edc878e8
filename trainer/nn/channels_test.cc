// Channels as data: the dependency groups of the zoo's networks and of a graph with every
// coupling (residual add, depthwise convolution, concat, flatten), and compaction, checked
// against its reference: the compacted network computes what the network with the removed
// channels zeroed computes (training and inference mode, every zoo network). Hostile requests
// (a fixed group, an emptied layer) are refused by name and change nothing.
#include "trainer/nn/channels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "trainer/nn/graph.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"

namespace topiary {
namespace {

using topiary::v1::LayerNode;
using topiary::v1::NetworkGraph;

// Every parameter random (variances positive), so that zeroed channels matter wherever they
// travel and batch norm's statistics are not the identity.
void Randomize(Model* model, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (Parameter* p : model->parameters()) {
    std::vector<float> v(p->size());
    for (float& x : v) x = p->role == ParamRole::kRunningVar ? 0.5f + std::abs(u(rng)) : u(rng);
    if (p->role == ParamRole::kKernel) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(p->size() / p->value.shape()[0]));
      for (float& x : v) x *= scale;
    }
    p->value.CopyFromHost(v.data());
  }
}

// The logits of `model` for a fixed random batch.
std::vector<float> Logits(Model* model, bool training, int batch = 3) {
  auto net = Network::Plan(model, batch, training);
  EXPECT_TRUE(net.ok()) << net.status();
  if (!net.ok()) return {};
  const Shape4 in = model->input_shape();
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (size_t i = 0; i < static_cast<size_t>(batch) * in.per_image(); ++i) {
    (*net)->input()[i] = n(rng);
  }
  EXPECT_TRUE((*net)->Forward(training).ok());
  const float* y = static_cast<const float*>((*net)->logits());
  return std::vector<float>(y, y + batch * model->classes());
}

double MaxRel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return err / scale;
}

// About a third of the classes of every prunable group, at random, never all of them.
std::vector<bool> SomeOfEachGroup(const ChannelGroups& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<bool> remove(g.classes.size(), false);
  for (const DependencyGroup& group : g.groups) {
    if (!group.fixed.empty()) continue;
    for (size_t i = 1; i < group.classes.size(); ++i) remove[group.classes[i]] = rng() % 3 == 0;
  }
  return remove;
}

int RemovedCount(const std::vector<bool>& remove) {
  return static_cast<int>(std::count(remove.begin(), remove.end(), true));
}

// The compacted network against the zeroed one, in both modes; and the compacted network is
// smaller by what was removed.
void ExpectCompactionExact(Model* model, const ChannelGroups& groups,
                           const std::vector<bool>& remove) {
  auto small = CompactModel(*model, groups, remove);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_LT((*small)->trainable_parameter_count(), model->trainable_parameter_count());
  EXPECT_EQ(MultiplyAdds(**small), MultiplyAdds(*model, groups, remove));
  EXPECT_LT(MultiplyAdds(**small), MultiplyAdds(*model));
  EXPECT_EQ(DenseMultiplyAdds(**small), DenseMultiplyAdds(*model));
  EXPECT_EQ(DenseMultiplyAdds(*model), MultiplyAdds(*model));  // never compacted before
  ZeroChannels(model, groups, remove);
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    const auto want = Logits(model, training), got = Logits(small->get(), training);
    ASSERT_EQ(want.size(), got.size());
    // Fewer channels sum in another order; in training mode, deep layers' batch statistics
    // (3 images of 1x1 or 2x2 positions here) magnify that rounding about tenfold.
    EXPECT_LT(MaxRel(got, want), training ? 1e-4 : 1e-5);
  }
}

TEST(Channels, ResNetStagesAreGroupsAndTheLogitsAreFixed) {
  auto dev = MakeCpuDevice(1);
  auto model = BuildModel("resnet20", 1.0f, Shape4{1, 16, 16, 3}, 10, dev.get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto g = FindChannelGroups(**model);
  ASSERT_TRUE(g.ok()) << g.status();
  // Every class in exactly one group.
  std::vector<int> seen(g->classes.size(), 0);
  for (const DependencyGroup& group : g->groups) {
    for (int k : group.classes) ++seen[k];
  }
  for (int s : seen) EXPECT_EQ(s, 1);
  // The stem's channels are the first stage's residual stream: the stem and every block's
  // second convolution of stage 1 make them, 16 classes.
  const DependencyGroup& stem = g->groups[0];
  EXPECT_EQ(stem.classes.size(), 16u);
  EXPECT_GE(stem.layers.size(), 4u) << "stem plus three residual blocks";
  EXPECT_TRUE(stem.fixed.empty()) << stem.fixed;
  // A block's first convolution is a group of its own.
  int single = 0, fixed = 0;
  for (const DependencyGroup& group : g->groups) {
    single += group.layers.size() == 1 && group.fixed.empty();
    if (!group.fixed.empty()) {
      ++fixed;
      EXPECT_NE(group.fixed.find("logits"), std::string::npos) << group.fixed;
    }
  }
  EXPECT_EQ(single, 9);  // one per residual block
  EXPECT_EQ(fixed, 1);   // the classifier's outputs
}

TEST(Channels, EveryZooNetworkCompactsExactly) {
  auto dev = MakeCpuDevice(1);
  for (const std::string& arch : ModelNames()) {
    SCOPED_TRACE(arch);
    const bool imagenet = arch == "resnet18" || arch == "resnet34" || arch == "resnet50";
    if (arch == "resnet110" || arch == "resnet44") continue;  // resnet20-56 cover the family
    const Shape4 in = imagenet ? Shape4{1, 32, 32, 3} : Shape4{1, 12, 12, 1};
    auto model = BuildModel(arch, imagenet ? 0.25f : 0.5f, in, 10, dev.get());
    ASSERT_TRUE(model.ok()) << model.status();
    Randomize(model->get(), 11);
    auto g = FindChannelGroups(**model);
    ASSERT_TRUE(g.ok()) << g.status();
    const auto remove = SomeOfEachGroup(*g, 5);
    ASSERT_GT(RemovedCount(remove), 0);
    ExpectCompactionExact(model->get(), *g, remove);
  }
}

// Residual add, depthwise convolution, concat, flatten into a linear layer: one graph.
NetworkGraph CoupledGraph() {
  NetworkGraph g;
  g.set_arch("test:coupled");
  g.set_height(6);
  g.set_width(6);
  g.set_channels(2);
  g.set_classes(3);
  auto add = [&](const std::string& name, topiary::v1::NodeKind kind,
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
  };
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
  return g;
}

TEST(Channels, CouplingsOfAGraphAreFollowed) {
  auto dev = MakeCpuDevice(1);
  auto model = BuildModelFromGraph(CoupledGraph(), dev.get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto g = FindChannelGroups(**model);
  ASSERT_TRUE(g.ok()) << g.status();
  // Groups: {a, b, dw} (the add ties a and b, the depthwise convolution filters the sum),
  // {c}, {fc1}, and the logits {fc} (fixed).
  ASSERT_EQ(g->groups.size(), 4u);
  EXPECT_EQ(g->groups[0].name, "a");
  EXPECT_EQ(g->groups[0].layers, (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(g->groups[0].classes.size(), 8u);
  EXPECT_EQ(g->groups[1].name, "c");
  EXPECT_EQ(g->groups[2].name, "fc1");
  EXPECT_NE(g->groups[3].fixed.find("logits"), std::string::npos);

  Randomize(model->get(), 3);
  std::vector<bool> remove(g->classes.size(), false);
  remove[g->groups[0].classes[1]] = remove[g->groups[0].classes[6]] = true;
  remove[g->groups[1].classes[0]] = true;
  remove[g->groups[2].classes[4]] = true;
  auto graph = CompactGraph(**model, *g, remove);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->layers(0).out_channels(), 6);
  EXPECT_EQ(graph->layers(5).out_channels(), 6);
  EXPECT_EQ(graph->layers(5).groups(), 6);
  EXPECT_EQ(graph->layers(7).out_channels(), 3);
  EXPECT_EQ(graph->layers(11).out_channels(), 5);
  // The dense widths stay in the graph, through a second compaction too.
  EXPECT_EQ(graph->layers(0).original_out_channels(), 8);
  EXPECT_EQ(graph->layers(7).original_out_channels(), 4);
  EXPECT_EQ(graph->layers(12).original_out_channels(), 0);  // the logits: never compacted
  {
    auto small = CompactModel(**model, *g, remove);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_EQ((*small)->original_out_channels("a"), 8);
    auto g2 = FindChannelGroups(**small);
    ASSERT_TRUE(g2.ok()) << g2.status();
    std::vector<bool> again(g2->classes.size(), false);
    again[g2->groups[0].classes[0]] = true;
    auto smaller = CompactGraph(**small, *g2, again);
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    EXPECT_EQ(smaller->layers(0).out_channels(), 5);
    EXPECT_EQ(smaller->layers(0).original_out_channels(), 8);
  }
  ExpectCompactionExact(model->get(), *g, remove);
}

TEST(Channels, MomentumAndElementMasksAreSliced) {
  auto dev = MakeCpuDevice(1);
  auto model = BuildModelFromGraph(CoupledGraph(), dev.get());
  ASSERT_TRUE(model.ok()) << model.status();
  Randomize(model->get(), 4);
  Parameter* c = (*model)->FindLayer("c")->parameter(ParamRole::kKernel);
  // Momentum and mask entry = the kernel entry's own index, so the slice can be read back.
  std::vector<float> m(c->size());
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i);
  c->momentum.CopyFromHost(m.data());
  std::vector<uint8_t> mask(c->size(), 1);
  mask[3 * 3 * 8 * 2 + 5] = 0;  // output channel 2, input channel 5 of the first tap
  MaskInfo info;
  info.kind = MaskInfo::Kind::kElement;
  ASSERT_TRUE(InstallMask(c, mask, info).ok());
  auto g = FindChannelGroups(**model);
  ASSERT_TRUE(g.ok());
  std::vector<bool> remove(g->classes.size(), false);
  remove[g->groups[0].classes[0]] = true;  // input channel 0 of c
  remove[g->groups[1].classes[1]] = true;  // output channel 1 of c
  auto small = CompactModel(**model, *g, remove);
  ASSERT_TRUE(small.ok()) << small.status();
  const Parameter* s = (*small)->FindLayer("c")->parameter(ParamRole::kKernel);
  ASSERT_EQ(s->value.shape(), (std::vector<int>{3, 3, 3, 7}));
  const auto sm = s->momentum.ToHost();
  // New [k, r, s, c] = old [k < 1 ? k : k + 1, r, s, c + 1].
  EXPECT_EQ(sm[0], m[1]);
  EXPECT_EQ(sm[7 * 9], m[2 * 72 + 1]);
  const auto smask = HostMask(*s);
  EXPECT_EQ(s->mask_info.kind, MaskInfo::Kind::kElement);
  EXPECT_EQ(smask[1 * 63 + 4], 0);  // the masked entry, moved
  EXPECT_EQ(MaskedCount(*s), 1);
}

TEST(Channels, HostileRequestsAreRefusedByName) {
  auto dev = MakeCpuDevice(1);
  NetworkGraph graph = CoupledGraph();
  // A grouped (not depthwise) convolution ties its channels: its groups are fixed.
  LayerNode* dw = graph.mutable_layers(5);
  dw->set_groups(2);
  auto model = BuildModelFromGraph(graph, dev.get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto g = FindChannelGroups(**model);
  ASSERT_TRUE(g.ok()) << g.status();
  const DependencyGroup& tied = g->groups[0];
  EXPECT_NE(tied.fixed.find("layer 'dw': a grouped convolution (2 groups)"), std::string::npos)
      << tied.fixed;
  std::vector<bool> remove(g->classes.size(), false);
  remove[tied.classes[0]] = true;
  auto refused = CompactModel(**model, *g, remove);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("group 'a' cannot be removed"), std::string::npos)
      << refused.status();

  // Every channel of a layer: refused, naming the layer.
  std::fill(remove.begin(), remove.end(), false);
  for (const DependencyGroup& group : g->groups) {
    if (group.name == "c") {
      for (int k : group.classes) remove[k] = true;
    }
  }
  refused = CompactModel(**model, *g, remove);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("layer 'c' would keep no channel"), std::string::npos)
      << refused.status();

  // A flag per class, no more, no fewer.
  refused = CompactModel(**model, *g, std::vector<bool>(3, false));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("channel classes marked"), std::string::npos);
}

}  // namespace
}  // namespace topiary
