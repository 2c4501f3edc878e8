// Channels as data: the dependency groups of the zoo's networks and of a graph with every
// coupling (residual add, depthwise convolution, concat, flatten), and compaction, checked
// against its reference: the compacted network computes what the network with the removed
// channels zeroed computes (training and inference mode, every zoo network and an imported
// MobileNetV2-style graph). Hostile requests
// (a fixed group, an emptied layer) are refused by name and change nothing.
#include "trainer/nn/channels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "trainer/nn/graph.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/nn/test_graphs.h"

namespace topiary {
namespace {

using testing::CoupledGraph;
using testing::MobileNetGraph;
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

TEST(Channels, AnImportedMobileNetCompactsExactly) {
  auto dev = MakeCpuDevice(1);
  auto model = BuildModelFromGraph(MobileNetGraph(), dev.get());
  ASSERT_TRUE(model.ok()) << model.status();
  Randomize(model->get(), 13);
  auto g = FindChannelGroups(**model);
  ASSERT_TRUE(g.ok()) << g.status();
  // The residual stream of blocks 0 (stem, b0 project) and of block 2 (b1, b2 project) are
  // one group each; every expand's channels are tied to its depthwise convolution's.
  int prunable = 0;
  for (const DependencyGroup& group : g->groups) {
    prunable += group.fixed.empty();
    if (group.name == "stem") {
      EXPECT_EQ(group.layers.size(), 2u);
    }
    if (group.name == "b0_expand") {
      EXPECT_EQ(group.layers.size(), 2u);  // expand and depthwise
    }
  }
  EXPECT_EQ(prunable, 6);  // stem stream, 3 expands, b1's stream, head
  const auto remove = SomeOfEachGroup(*g, 9);
  ASSERT_GT(RemovedCount(remove), 0);
  ExpectCompactionExact(model->get(), *g, remove);
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

// Block and N:M masks on `c` (3x3, 8 inputs from the {a, b, dw} group, 4 outputs): removing
// whole blocks (or whole groups of m inputs) keeps the structure; removing one channel of a
// block (or breaking the groups) leaves an element mask with the same zeros. The compacted
// network stays exact either way.
TEST(Channels, BlockAndNofMMasksAreCarriedThroughCompaction) {
  auto dev = MakeCpuDevice(1);
  struct Case {
    std::string what;
    MaskInfo::Kind kind;
    std::vector<int> inputs_removed;  // of c's 8 input channels
    MaskInfo::Kind after;
  };
  const std::vector<Case> cases = {
      {"block, whole input block removed",
       MaskInfo::Kind::kBlock,
       {4, 5, 6, 7},
       MaskInfo::Kind::kBlock},
      {"block, one channel of a block removed",
       MaskInfo::Kind::kBlock,
       {1},
       MaskInfo::Kind::kElement},
      {"2:4, whole group removed", MaskInfo::Kind::kNofM, {0, 1, 2, 3}, MaskInfo::Kind::kNofM},
      {"2:4, groups broken", MaskInfo::Kind::kNofM, {2}, MaskInfo::Kind::kElement},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.what);
    auto model = BuildModelFromGraph(CoupledGraph(), dev.get());
    ASSERT_TRUE(model.ok()) << model.status();
    Randomize(model->get(), 6);
    Parameter* c = (*model)->FindLayer("c")->parameter(ParamRole::kKernel);
    const int out = 4, taps = 9, in = 8;
    MaskInfo info;
    info.kind = tc.kind;
    std::vector<uint8_t> mask;
    if (tc.kind == MaskInfo::Kind::kBlock) {  // 4x2 blocks: input block 0 of output block 1 off
      info.blocks = kernels::BlockGrid::Dense(in, out, 4, 2);
      info.blocks.at(0, 1) = 0;
      mask = info.blocks.Expand(out, taps, in);
    } else {  // 2:4: of each group of 4 inputs, the 2 at (k + t) % 4 and (k + t + 1) % 4
      info.n = 2;
      info.m = 4;
      mask.assign(static_cast<size_t>(out) * taps * in, 0);
      for (int k = 0; k < out; ++k) {
        for (int t = 0; t < taps; ++t) {
          for (int c0 = 0; c0 < in; c0 += 4) {
            mask[(k * taps + t) * in + c0 + (k + t) % 4] = 1;
            mask[(k * taps + t) * in + c0 + (k + t + 1) % 4] = 1;
          }
        }
      }
    }
    ASSERT_TRUE(InstallMask(c, mask, info).ok());
    const int64_t masked = MaskedCount(*c);
    auto g = FindChannelGroups(**model);
    ASSERT_TRUE(g.ok());
    std::vector<bool> remove(g->classes.size(), false);
    for (int ch : tc.inputs_removed)
      remove[g->value_classes[(*model)->nodes()[4].output][ch]] = true;
    auto small = CompactModel(**model, *g, remove);
    ASSERT_TRUE(small.ok()) << small.status();
    const Parameter* s = (*small)->FindLayer("c")->parameter(ParamRole::kKernel);
    EXPECT_EQ(s->mask_info.kind, tc.after);
    // The masked entries of the kept columns, no more, no fewer.
    int64_t want = 0;
    for (int k = 0; k < out; ++k)
      for (int t = 0; t < taps; ++t)
        for (int ch = 0; ch < in; ++ch) {
          const bool gone = std::count(tc.inputs_removed.begin(), tc.inputs_removed.end(), ch);
          want += !gone && !mask[(k * taps + t) * in + ch];
        }
    EXPECT_EQ(MaskedCount(*s), want);
    EXPECT_LE(want, masked);
    if (tc.after == MaskInfo::Kind::kBlock) {
      EXPECT_EQ(s->mask_info.blocks.rows, 1);
      EXPECT_EQ(s->mask_info.blocks.at(0, 1), 0);
      EXPECT_EQ(s->mask_info.blocks.Expand(out, taps, 4), HostMask(*s));
    }
    ExpectCompactionExact(model->get(), *g, remove);
  }
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
