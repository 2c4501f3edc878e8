#include "pruning/pruner.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "pruning/block_mask.h"
#include "pruning/element_mask.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"

namespace topiary::pruning {
namespace {

using topiary::v1::PruningSpec;

PruningSpec Defaults(PruningSpec::Method method) {
  PruningSpec s;
  s.set_method(method);
  s.set_block_in(8);
  s.set_block_out(8);
  s.set_target(0.5f);
  s.set_step_fraction(0.2f);
  s.set_n(2);
  s.set_m(4);
  return s;
}

struct Fixture {
  std::unique_ptr<Device> device = MakeCpuDevice(1);
  std::unique_ptr<Model> model;
  explicit Fixture(const std::string& arch) {
    model = *BuildModel(arch, 1.0f, {1, 28, 28, 1}, 10, device.get());
    model->Initialize(3);
  }
  Parameter* Kernel(const std::string& layer) {
    Layer* l = model->FindLayer(layer);
    EXPECT_NE(l, nullptr) << layer;
    for (Parameter* p : l ? l->parameters() : std::vector<Parameter*>{}) {
      if (p->role == ParamRole::kKernel) return p;
    }
    ADD_FAILURE() << "no kernel in " << layer;
    static Parameter none;
    return &none;
  }
};

void ExpectMaskedWeightsZero(const Parameter& p) {
  const std::vector<float> w = p.value.ToHost();
  const std::vector<float> mom = p.momentum.ToHost();
  const std::vector<uint8_t> m = HostMask(p);
  for (size_t i = 0; i < w.size(); ++i) {
    if (!m[i]) {
      ASSERT_EQ(w[i], 0.0f) << p.full_name() << " [" << i << "]";
      ASSERT_EQ(mom[i], 0.0f) << p.full_name() << " [" << i << "]";
    }
  }
}

TEST(Pruner, BlockRoundsReachHalfOfEveryEligibleConvAndNeverTouchTheStem) {
  Fixture f("resnet20");
  auto pruner = MakePruner(Defaults(PruningSpec::BLOCK), f.model.get(), 1);
  ASSERT_TRUE(pruner.ok()) << pruner.status();
  int rounds = 0;
  while (!(*pruner)->finished() && rounds < 20) {
    auto reports = (*pruner)->Step(++rounds, nullptr);
    ASSERT_TRUE(reports.ok()) << reports.status();
    EXPECT_EQ(reports->size(), 20u);  // 18 block convs + 2 shortcut convs; not the stem, not fc
    for (const LayerPruneReport& r : *reports) {
      EXPECT_NE(r.layer, "stem.conv");
      EXPECT_GE(r.zeros_after, r.zeros_before);
    }
  }
  EXPECT_LE(rounds, 13);
  EXPECT_TRUE(f.Kernel("stem.conv")->mask.empty());
  EXPECT_TRUE(f.Kernel("fc")->mask.empty());
  for (const char* name :
       {"stage1.block0.conv1", "stage2.block0.shortcut.conv", "stage3.block2.conv2"}) {
    const Parameter& p = *f.Kernel(name);
    ASSERT_EQ(p.mask_info.kind, MaskInfo::Kind::kBlock) << name;
    const BlockGrid& g = p.mask_info.blocks;
    EXPECT_EQ(g.zeros(), g.rows * g.cols / 2) << name;
    ExpectMaskedWeightsZero(p);
    // The element mask is the expanded grid.
    const auto& s = p.value.shape();
    EXPECT_EQ(HostMask(p), g.Expand(s[0], s[1] * s[2], s[3])) << name;
  }
}

TEST(Pruner, GlobalMagnitudeReachesTheOverallTarget) {
  Fixture f("lenet5");
  PruningSpec spec = Defaults(PruningSpec::MAGNITUDE);
  spec.set_global(true);
  spec.set_target(0.8f);
  spec.set_step_fraction(0.5f);
  auto pruner = MakePruner(spec, f.model.get(), 1);
  ASSERT_TRUE(pruner.ok()) << pruner.status();
  int rounds = 0;
  while (!(*pruner)->finished() && rounds < 10)
    ASSERT_TRUE((*pruner)->Step(++rounds, nullptr).ok());
  EXPECT_EQ(rounds, 2);
  int64_t total = 0, zeros = 0;
  for (const char* name : {"conv1", "conv2", "fc1", "fc2", "fc"}) {
    const Parameter& p = *f.Kernel(name);
    total += p.size();
    zeros += MaskedCount(p);
    ExpectMaskedWeightsZero(p);
    EXPECT_EQ(p.mask_info.kind, MaskInfo::Kind::kElement);
  }
  EXPECT_EQ(zeros, static_cast<int64_t>(0.8 * total));
}

TEST(Pruner, TwoOfFourSkipsLayersWhoseInputsAreNotAMultipleOfFour) {
  Fixture f("resnet20");
  auto pruner = MakePruner(Defaults(PruningSpec::N_OF_M), f.model.get(), 1);
  ASSERT_TRUE(pruner.ok()) << pruner.status();
  auto reports = (*pruner)->Step(1, nullptr);
  ASSERT_TRUE(reports.ok());
  EXPECT_EQ(reports->size(), 21u);  // 20 convs + fc; the 1-channel stem is skipped
  EXPECT_TRUE((*pruner)->finished());
  const Parameter& p = *f.Kernel("stage2.block1.conv1");
  const std::vector<float> w = p.value.ToHost();
  const auto& s = p.value.shape();
  KernelView v{s[0], s[1] * s[2], s[3], w.data()};
  EXPECT_TRUE(SatisfiesNofM(v, 2, 4, HostMask(p)));
  EXPECT_EQ(MaskedCount(p), static_cast<int64_t>(p.size() / 2));
}

TEST(Pruner, OverridesExcludeAndRetarget) {
  Fixture f("resnet20");
  PruningSpec spec = Defaults(PruningSpec::MAGNITUDE);
  spec.set_step_fraction(1.0f);
  auto* o = spec.add_overrides();
  o->set_layer("stage3.*");
  o->set_exclude(true);
  o = spec.add_overrides();
  o->set_layer("stage1.block0.conv?");
  o->set_target(0.25f);
  auto pruner = MakePruner(spec, f.model.get(), 1);
  ASSERT_TRUE(pruner.ok()) << pruner.status();
  ASSERT_TRUE((*pruner)->Step(1, nullptr).ok());
  EXPECT_TRUE(f.Kernel("stage3.block0.conv1")->mask.empty());
  const Parameter& p = *f.Kernel("stage1.block0.conv2");
  EXPECT_EQ(MaskedCount(p), static_cast<int64_t>(0.25 * p.size()));
  EXPECT_EQ(MaskedCount(*f.Kernel("stage2.block0.conv2")),
            static_cast<int64_t>(0.5 * f.Kernel("stage2.block0.conv2")->size()));
}

// Tile-shaped blocks on resnet20 (16/32/64 channels): 8x32 blocks need at least 64 output
// channels for two columns, so only stage 3 is pruned; the rest is reported, with why.
TEST(Pruner, LayersTooSmallForTheBlockShapeAreReportedDense) {
  Fixture f("resnet20");
  PruningSpec spec = Defaults(PruningSpec::BLOCK);
  spec.set_block_out(32);
  spec.set_balanced(true);
  auto* o = spec.add_overrides();
  o->set_layer("stage3.block2.*");
  o->set_exclude(true);
  auto pruner = MakePruner(spec, f.model.get(), 1);
  ASSERT_TRUE(pruner.ok()) << pruner.status();
  const std::vector<std::string> dense = (*pruner)->dense_layers();
  auto says = [&](const std::string& layer, const std::string& why) {
    for (const std::string& d : dense) {
      if (d.rfind(layer + ": ", 0) == 0) return d.find(why) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(says("stem.conv", "1 input x 16 output channels make 1 x 1 blocks of 8 x 32"));
  EXPECT_TRUE(says("stage2.block1.conv1", "32 input x 32 output channels make 4 x 1 blocks"));
  EXPECT_TRUE(says("stage3.block2.conv1", "excluded by pruning.overrides"));
  EXPECT_TRUE(says("fc", "block masks prune convolutions only"));
  EXPECT_FALSE(says("stage3.block1.conv1", ""));
  ASSERT_TRUE((*pruner)->Step(1, nullptr).ok());
  EXPECT_FALSE(f.Kernel("stage3.block1.conv1")->mask.empty());
  EXPECT_TRUE(f.Kernel("stage2.block1.conv1")->mask.empty());
}

TEST(Pruner, ErrorsNameTheField) {
  Fixture f("resnet20");
  PruningSpec spec = Defaults(PruningSpec::BLOCK);
  spec.add_overrides()->set_layer("stage9.*");
  auto pruner = MakePruner(spec, f.model.get(), 1);
  ASSERT_FALSE(pruner.ok());
  EXPECT_NE(pruner.status().message().find("pruning.overrides[0].layer: 'stage9.*'"),
            std::string::npos)
      << pruner.status();

  Fixture lenet("lenet5");  // convs of 1 -> 6 -> 16 channels: one input block each
  pruner = MakePruner(Defaults(PruningSpec::BLOCK), lenet.model.get(), 1);
  ASSERT_FALSE(pruner.ok());
  EXPECT_NE(pruner.status().message().find("no layer of lenet5 is eligible for BLOCK"),
            std::string::npos)
      << pruner.status();
}

}  // namespace
}  // namespace topiary::pruning
