// Channel pruning's choice: scores against hand computations, the per-group schedule with
// round_to and min_channels, rounds on a compacted network continuing from its original
// widths, the FLOPs target across groups (reached exactly, costly channels first, at most
// max_fraction of a group), and
// bad requests refused by field.
#include "pruning/channel_select.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "trainer/nn/channels.h"
#include "trainer/nn/model_zoo.h"

namespace topiary::pruning {
namespace {

using topiary::v1::PruningSpec;

std::unique_ptr<Model> ResNet20(Device* dev) {
  auto model = BuildModel("resnet20", 1.0f, Shape4{1, 16, 16, 3}, 10, dev);
  EXPECT_TRUE(model.ok()) << model.status();
  (*model)->Initialize(1);
  // Batch-norm scales random too, for BN_SCALE.
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(0.1f, 2.0f);
  for (Parameter* p : (*model)->parameters()) {
    if (p->role != ParamRole::kGamma) continue;
    std::vector<float> v(p->size());
    for (float& x : v) x = u(rng);
    p->value.CopyFromHost(v.data());
  }
  return std::move(*model);
}

PruningSpec Spec(float target, float step) {
  PruningSpec s;
  s.set_method(PruningSpec::CHANNEL);
  s.set_score(PruningSpec::L1);
  s.set_target(target);
  s.set_step_fraction(step);
  s.set_min_channels(1);
  return s;
}

const ChannelGroupChoice& GroupNamed(const ChannelChoice& c, const std::string& name) {
  for (const auto& g : c.groups) {
    if (g.group == name) return g;
  }
  ADD_FAILURE() << "no group " << name;
  return c.groups.front();
}

TEST(ChannelSelect, ScoresAreTheMeansOfTheirRows) {
  auto dev = MakeCpuDevice(1);
  auto model = ResNet20(dev.get());
  auto groups = FindChannelGroups(*model);
  ASSERT_TRUE(groups.ok());
  for (PruningSpec::Score score :
       {PruningSpec::L1, PruningSpec::L2, PruningSpec::VARIANCE, PruningSpec::BN_SCALE}) {
    auto s = ChannelScores(*model, *groups, score, nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    // A block's first convolution: one producer, one batch norm after it.
    const DependencyGroup* single = nullptr;
    for (const auto& g : groups->groups) {
      if (g.layers.size() == 1 && g.fixed.empty()) single = &g;
    }
    ASSERT_NE(single, nullptr);
    const Model::Node& conv = model->nodes()[single->layers[0]];
    const Model::Node& bn = model->nodes()[single->layers[0] + 1];
    ASSERT_EQ(bn.layer->kind(), LayerKind::kBatchNorm);
    const auto w = conv.layer->parameter(ParamRole::kKernel)->value.ToHost();
    const auto gamma = bn.layer->parameter(ParamRole::kGamma)->value.ToHost();
    const size_t row = w.size() / gamma.size();
    for (size_t c = 0; c < gamma.size(); ++c) {
      double sum = 0, sq = 0;
      for (size_t i = c * row; i < (c + 1) * row; ++i) {
        const double x = score == PruningSpec::L1   ? std::fabs(w[i])
                         : score == PruningSpec::L2 ? w[i] * w[i]
                                                    : w[i];
        sum += x;
        sq += x * x;
      }
      const double mean = sum / row;
      const double want = score == PruningSpec::BN_SCALE   ? std::fabs(gamma[c])
                          : score == PruningSpec::VARIANCE ? sq / row - mean * mean
                                                           : mean;
      const int k = groups->value_classes[conv.output][c];
      EXPECT_NEAR((*s)[k], want, 1e-6 * std::max(1.0, std::fabs(want)))
          << PruningSpec::Score_Name(score) << " channel " << c;
    }
  }
  // GRAD_L2 without gradient statistics: refused by name.
  auto refused = ChannelScores(*model, *groups, PruningSpec::GRAD_L2, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("GRAD_L2 scores need gradient statistics"),
            std::string::npos);
}

TEST(ChannelSelect, ScheduleRoundToAndFloorsPerGroup) {
  auto dev = MakeCpuDevice(1);
  auto model = ResNet20(dev.get());
  auto groups = FindChannelGroups(*model);
  ASSERT_TRUE(groups.ok());
  struct Case {
    int round_to, min_channels, round;
    int stem_after;  // of 16 (target 0.5, step 0.5: round 1 asks 12, round 2 asks 8)
  };
  for (const Case& c : {Case{0, 1, 1, 12}, Case{0, 1, 2, 8}, Case{8, 1, 1, 16}, Case{4, 1, 1, 12},
                        Case{8, 1, 2, 8}, Case{0, 14, 1, 14}, Case{0, 1, 9, 8}}) {
    SCOPED_TRACE(testing::Message()
                 << "round_to " << c.round_to << " min " << c.min_channels << " round " << c.round);
    PruningSpec spec = Spec(0.5f, 0.5f);
    spec.set_round_to(c.round_to);
    spec.set_min_channels(c.min_channels);
    auto choice = ChooseChannels(*model, *groups, spec, c.round, nullptr);
    ASSERT_TRUE(choice.ok()) << choice.status();
    const auto& stem = choice->groups[0];
    EXPECT_EQ(stem.original, 16);
    EXPECT_EQ(stem.after, c.stem_after);
    // The lowest scores go: every removed class of a group scores at most every kept one.
    auto scores = ChannelScores(*model, *groups, PruningSpec::L1, nullptr);
    for (const auto& g : groups->groups) {
      double max_removed = -1, min_kept = 1e30;
      for (int k : g.classes) {
        if (choice->remove[k]) max_removed = std::max(max_removed, (*scores)[k]);
        if (!choice->remove[k]) min_kept = std::min(min_kept, (*scores)[k]);
      }
      EXPECT_LE(max_removed, min_kept) << g.name;
    }
    // The fixed group (the logits) keeps every channel and says why.
    EXPECT_NE(choice->groups.back().whole.find("logits"), std::string::npos);
    EXPECT_LT(choice->macs_after, choice->macs_before);
  }
}

TEST(ChannelSelect, RoundsOnACompactedNetworkContinueFromTheOriginalWidths) {
  auto dev = MakeCpuDevice(1);
  auto model = ResNet20(dev.get());
  const PruningSpec spec = Spec(0.5f, 0.5f);
  auto groups = FindChannelGroups(*model);
  ASSERT_TRUE(groups.ok());
  auto first = ChooseChannels(*model, *groups, spec, 1, nullptr);
  ASSERT_TRUE(first.ok());
  auto small = CompactModel(*model, *groups, first->remove);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(MultiplyAdds(**small), first->macs_after);  // the count is exact
  auto groups2 = FindChannelGroups(**small);
  ASSERT_TRUE(groups2.ok());
  auto second = ChooseChannels(**small, *groups2, spec, 2, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  const auto& stem = second->groups[0];
  EXPECT_EQ(stem.original, 16);
  EXPECT_EQ(stem.before, 12);
  EXPECT_EQ(stem.after, 8);
  EXPECT_EQ(GroupNamed(*second, stem.group).after, 8);
  EXPECT_EQ(second->dense_macs, first->dense_macs);  // from the original widths
  EXPECT_EQ(first->dense_macs, MultiplyAdds(*model));
}

TEST(ChannelSelect, FlopsTargetIsReachedAcrossGroups) {
  auto dev = MakeCpuDevice(1);
  auto model = ResNet20(dev.get());
  auto groups = FindChannelGroups(*model);
  ASSERT_TRUE(groups.ok());
  for (float keep : {0.7f, 0.5f, 0.3f}) {
    SCOPED_TRACE(keep);
    PruningSpec spec = Spec(0.5f, 1.0f);
    spec.set_target_flops(keep);
    auto choice = ChooseChannels(*model, *groups, spec, 1, nullptr);
    ASSERT_TRUE(choice.ok()) << choice.status();
    const double share = static_cast<double>(choice->macs_after) / choice->dense_macs;
    EXPECT_LE(share, keep);
    EXPECT_GT(share, keep - 0.05);  // no more than needed
    auto small = CompactModel(*model, *groups, choice->remove);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_EQ(MultiplyAdds(**small), choice->macs_after);
    // Halfway there in the first of two rounds.
    spec.set_step_fraction(0.5f);
    auto half = ChooseChannels(*model, *groups, spec, 1, nullptr);
    ASSERT_TRUE(half.ok());
    EXPECT_LE(static_cast<double>(half->macs_after) / half->dense_macs, 1 - (1 - keep) / 2);
    EXPECT_GT(half->macs_after, choice->macs_after);
  }
  // round_to 16 on 16-, 32- and 64-channel groups: every group keeps a multiple of 16.
  PruningSpec spec = Spec(0.5f, 1.0f);
  spec.set_target_flops(0.5f);
  spec.set_round_to(16);
  auto choice = ChooseChannels(*model, *groups, spec, 1, nullptr);
  ASSERT_TRUE(choice.ok()) << choice.status();
  for (const auto& g : choice->groups) {
    if (g.whole.empty()) {
      EXPECT_EQ(g.after % 16, 0) << g.group;
    }
  }
}

// The FLOPs target's order: with every channel's score equal to its group's mean, the
// channels that save the most multiply-adds go first; max_fraction caps each group's share.
TEST(ChannelSelect, FlopsTargetTakesCostlyChannelsFirstUpToMaxFraction) {
  auto dev = MakeCpuDevice(1);
  auto model = ResNet20(dev.get());
  for (Parameter* p : model->parameters()) {  // every row's L1 the same within a layer
    if (p->role != ParamRole::kKernel) continue;
    std::vector<float> v(p->size(), 0.01f);
    p->value.CopyFromHost(v.data());
  }
  auto groups = FindChannelGroups(*model);
  ASSERT_TRUE(groups.ok());
  const std::vector<int64_t> saved = ClassMultiplyAdds(*model, *groups);
  PruningSpec spec = Spec(0.5f, 1.0f);
  spec.set_target_flops(0.8f);
  spec.set_max_fraction(1.0f);
  auto choice = ChooseChannels(*model, *groups, spec, 1, nullptr);
  ASSERT_TRUE(choice.ok()) << choice.status();
  int64_t least_removed = INT64_MAX, most_kept = 0;
  for (size_t g = 0; g < groups->groups.size(); ++g) {
    if (!choice->groups[g].whole.empty()) continue;
    for (int k : groups->groups[g].classes) {
      if (choice->remove[k]) {
        least_removed = std::min(least_removed, saved[k]);
      } else if (choice->groups[g].after > 1) {  // not held back by the floor
        most_kept = std::max(most_kept, saved[k]);
      }
    }
  }
  EXPECT_GE(least_removed, most_kept);
  // max_fraction 0.5: no group loses more than half of its channels, and the target is still
  // met by taking from more groups.
  spec.set_target_flops(0.5f);
  spec.set_max_fraction(0.5f);
  choice = ChooseChannels(*model, *groups, spec, 1, nullptr);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_LE(static_cast<double>(choice->macs_after) / choice->dense_macs, 0.5);
  for (const auto& g : choice->groups) EXPECT_GE(2 * g.after, g.before) << g.group;
  // max_fraction 0.25 cannot reach 50%: refused, naming the floor.
  spec.set_max_fraction(0.25f);
  auto refused = ChooseChannels(*model, *groups, spec, 1, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_fraction 0.25"), std::string::npos)
      << refused.status();
}

TEST(ChannelSelect, BadRequestsAreRefusedByField) {
  auto dev = MakeCpuDevice(1);
  auto model = ResNet20(dev.get());
  auto groups = FindChannelGroups(*model);
  ASSERT_TRUE(groups.ok());
  PruningSpec spec = Spec(0.5f, 1.0f);
  spec.add_overrides()->set_layer("no_such_layer*");
  auto refused = ChooseChannels(*model, *groups, spec, 1, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pruning.overrides[0].layer: 'no_such_layer*'"),
            std::string::npos)
      << refused.status();

  // Floors that leave more than the FLOPs target allows.
  spec = Spec(0.5f, 1.0f);
  spec.set_target_flops(0.01f);
  spec.set_min_channels(12);
  refused = ChooseChannels(*model, *groups, spec, 1, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pruning.target_flops: 0.01"), std::string::npos)
      << refused.status();

  // An excluded group keeps every channel, saying why.
  spec = Spec(0.5f, 1.0f);
  auto* o = spec.add_overrides();
  o->set_layer(model->nodes()[groups->groups[0].layers[0]].layer->name());
  o->set_exclude(true);
  auto choice = ChooseChannels(*model, *groups, spec, 1, nullptr);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->groups[0].after, choice->groups[0].before);
  EXPECT_NE(choice->groups[0].whole.find("excluded by pruning.overrides[0]"), std::string::npos);
}

}  // namespace
}  // namespace topiary::pruning
