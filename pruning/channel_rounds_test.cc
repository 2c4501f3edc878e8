// Channel pruning end to end on the CPU: rounds that make the network smaller (the round
// table's multiply-adds and parameters shrink, the checkpoints hold the narrower graph with
// its dense widths), two data-parallel ranks compacting together, approximate convolutions on
// compacted layers, multiplier power weighing only kept multiply-accumulates, a FLOPs target
// across groups, and a run resumed from a compacted checkpoint continuing bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "pruning/rounds_test_util.h"
#include "trainer/run/approx_eval.h"
#include "trainer/run/runner_test_util.h"
#include "trainer/store/checkpoint.h"

namespace topiary {
namespace {

using testing::OutDir;
using testing::PruningOptions;
using testing::RunWithLosses;
using testing::StepLosses;
using testing::SyntheticRun;

// resnet20 at half width (8, 16, 32 channels): half of every group's channels over two rounds.
constexpr char kChannelRounds[] = R"(
  name: "channels" seed: 5
  data { synthetic { train_size: 320 test_size: 160 } }
  train { epochs: 2 }
  pruning { method: CHANNEL target: 0.5 step_fraction: 0.5 finetune_epochs: 1 }
  checkpoints { every_epochs: 1 }
)";

TEST(ChannelRounds, EachRoundTrainsASmallerNetwork) {
  const std::string dir = OutDir("channels");
  const StepLosses run = RunWithLosses(SyntheticRun(kChannelRounds), PruningOptions(dir));
  const auto& s = run.summary;
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  ASSERT_EQ(s.rounds_size(), 3);  // dense, then 25% and 50% of every group's channels
  EXPECT_TRUE(s.target_reached()) << s.target_note();
  const auto& dense = s.rounds(0);
  EXPECT_GT(dense.multiply_adds(), 0);
  EXPECT_GT(dense.step_seconds(), 0);
  for (int i = 1; i < s.rounds_size(); ++i) {
    EXPECT_LT(s.rounds(i).multiply_adds(), s.rounds(i - 1).multiply_adds()) << i;
    EXPECT_LT(s.rounds(i).parameters(), s.rounds(i - 1).parameters()) << i;
    EXPECT_GT(s.rounds(i).step_seconds(), 0) << i;
    EXPECT_GT(s.rounds(i).channel_groups_size(), 0) << i;
  }
  // Half the channels on both sides of most products: about a quarter of the multiply-adds
  // (the stem's input and the logits' outputs keep theirs).
  const double share = static_cast<double>(s.rounds(2).multiply_adds()) / dense.multiply_adds();
  EXPECT_LT(share, 0.35);
  EXPECT_GT(share, 0.2);
  for (const auto& g : s.rounds(2).channel_groups()) {
    if (!g.whole().empty()) continue;
    EXPECT_EQ(g.after(), (g.original() + 1) / 2) << g.group();
  }
  // The last round's checkpoint holds the narrow network and remembers the dense widths.
  auto file = OpenCheckpoint(s.checkpoint());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->state.network.has_value());
  int narrowed = 0;
  for (const auto& layer : file->state.network->layers()) {
    if (layer.original_out_channels() == 0) continue;
    ++narrowed;
    EXPECT_LT(layer.out_channels(), layer.original_out_channels()) << layer.name();
  }
  EXPECT_GT(narrowed, 10);
  EXPECT_GT(s.test_top1(), 0.0);
}

// Data parallelism (two CPU ranks): every rank compacts to the same network, and the run
// goes on training the smaller one (a rank left wide would fail the gradient sum's sizes).
TEST(ChannelRounds, DataParallelRanksCompactTogether) {
  const std::string dir = OutDir("channels_ranks");
  const StepLosses run =
      RunWithLosses(SyntheticRun(std::string(kChannelRounds) + "device { kind: CPU cpu_ranks: 2 }"),
                    PruningOptions(dir));
  const auto& s = run.summary;
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  ASSERT_EQ(s.rounds_size(), 3);
  for (const auto& g : s.rounds(2).channel_groups()) {
    if (!g.whole().empty()) continue;
    EXPECT_EQ(g.after(), (g.original() + 1) / 2) << g.group();
  }
  EXPECT_LT(s.rounds(2).multiply_adds(), s.rounds(0).multiply_adds());
  ASSERT_FALSE(run.loss.empty());
  for (const auto& [step, loss] : run.loss) EXPECT_TRUE(std::isfinite(loss)) << step;
}

// Approximate convolutions (both weight codes, per-channel weight scales) keep working on the
// compacted layers: the rounds train the smaller approximate network, and its last checkpoint,
// evaluated on its own, gives the top-1 the run recorded.
TEST(ChannelRounds, ApproximateConvolutionsWorkOnCompactedLayers) {
  for (const std::string code : {"ASYMMETRIC", "SIGN_MAGNITUDE"}) {
    SCOPED_TRACE(code);
    const auto spec = SyntheticRun(std::string(kChannelRounds) +
                                   "approximation { rules { layer: '*' multiplier: 'drum:6' } "
                                   "per_channel_weights: true weight_code: " +
                                   code + " }");
    const StepLosses run = RunWithLosses(spec, PruningOptions(OutDir("approx_" + code)));
    const auto& s = run.summary;
    ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
    ASSERT_EQ(s.rounds_size(), 3);
    EXPECT_LT(s.rounds(2).multiply_adds(), s.rounds(1).multiply_adds());
    for (const auto& [step, loss] : run.loss) ASSERT_TRUE(std::isfinite(loss)) << step;
    auto ev = CheckpointEvaluator::Open(s.checkpoint());
    ASSERT_TRUE(ev.ok()) << ev.status();
    auto again = (*ev)->Evaluate(std::nullopt);
    ASSERT_TRUE(again.ok()) << again.status();
    // (This tiny run's accuracy after removing half the channels is near chance with or
    // without approximation; the check is that the approximate network is consistent.)
    EXPECT_EQ(again->top1, s.test_top1());
    EXPECT_EQ(again->loss, s.test_loss());
  }
}

// Multiplier power counts pruning (CheckpointEvaluator::conv_layers, what Sensitivity
// weighs): a block-pruned checkpoint's layers do only their kept weights' multiply-
// accumulates (half of each pruned layer's, all of the stem's, which block pruning leaves
// dense), and a compacted checkpoint's layers those of their narrower kernels.
TEST(ChannelRounds, PowerWeighsOnlyKeptMultiplyAccumulates) {
  auto spec = SyntheticRun(kChannelRounds);
  spec.mutable_pruning()->set_method(topiary::v1::PruningSpec::BLOCK);
  spec.mutable_pruning()->set_block_in(4);
  spec.mutable_pruning()->set_block_out(4);
  spec.mutable_pruning()->set_step_fraction(1);
  const std::string dir = OutDir("kept_macs");
  const StepLosses blocks = RunWithLosses(spec, PruningOptions(dir));
  ASSERT_EQ(blocks.summary.state(), topiary::v1::SUCCEEDED) << blocks.summary.error();
  auto dense = CheckpointEvaluator::Open(dir + "/checkpoints/dense.h5");
  auto pruned = CheckpointEvaluator::Open(blocks.summary.checkpoint());
  ASSERT_TRUE(dense.ok()) << dense.status();
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  const auto& d = (*dense)->conv_layers();
  const auto& p = (*pruned)->conv_layers();
  ASSERT_EQ(d.size(), p.size());
  int halved = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    ASSERT_EQ(d[i].name, p[i].name);
    if (p[i].name == "stem.conv") {
      EXPECT_EQ(p[i].macs, d[i].macs);
    } else {
      EXPECT_EQ(2 * p[i].macs, d[i].macs) << p[i].name;
      ++halved;
    }
  }
  EXPECT_EQ(halved, 20);

  // Channels: the compacted network's convolutions, each at its narrower width.
  const std::string cdir = OutDir("kept_macs_channels");
  const StepLosses channels = RunWithLosses(SyntheticRun(kChannelRounds), PruningOptions(cdir));
  ASSERT_EQ(channels.summary.state(), topiary::v1::SUCCEEDED) << channels.summary.error();
  auto small = CheckpointEvaluator::Open(channels.summary.checkpoint());
  ASSERT_TRUE(small.ok()) << small.status();
  int64_t total = 0, dense_total = 0;
  for (const auto& l : (*small)->conv_layers()) total += l.macs;
  for (const auto& l : d) dense_total += l.macs;
  const auto& rounds = channels.summary.rounds();
  const double share =
      static_cast<double>(rounds[rounds.size() - 1].multiply_adds()) / rounds[0].multiply_adds();
  // The convolutions' share follows the whole network's (the logits' linear layer aside).
  EXPECT_NEAR(static_cast<double>(total) / dense_total, share, 0.02);
}

TEST(ChannelRounds, AFlopsTargetIsReached) {
  auto spec = SyntheticRun(kChannelRounds);
  spec.mutable_pruning()->set_target_flops(0.5f);
  const StepLosses run = RunWithLosses(spec, PruningOptions(OutDir("flops")));
  const auto& s = run.summary;
  ASSERT_EQ(s.state(), topiary::v1::SUCCEEDED) << s.error();
  const auto& last = s.rounds(s.rounds_size() - 1);
  EXPECT_LE(static_cast<double>(last.multiply_adds()) / s.rounds(0).multiply_adds(), 0.5);
  EXPECT_TRUE(s.target_reached()) << s.target_note();

  // round_to 8 on groups of 8, 16 and 32 channels cannot get to 30%: the run ends at the
  // floors and says so instead of claiming the target.
  spec.mutable_pruning()->set_target_flops(0.3f);
  spec.mutable_pruning()->set_round_to(8);
  const StepLosses floors = RunWithLosses(spec, PruningOptions(OutDir("floors")));
  ASSERT_EQ(floors.summary.state(), topiary::v1::SUCCEEDED) << floors.summary.error();
  EXPECT_FALSE(floors.summary.target_reached());
  EXPECT_NE(floors.summary.target_note().find("target_flops 0.3 not reached: round_to 8"),
            std::string::npos)
      << floors.summary.target_note();
}

TEST(ChannelRounds, ResumedCompactedRunsContinueBitIdentically) {
  const auto spec = SyntheticRun(kChannelRounds);
  const std::string dir = OutDir("full");
  const StepLosses full = RunWithLosses(spec, PruningOptions(dir));
  ASSERT_EQ(full.summary.state(), topiary::v1::SUCCEEDED) << full.summary.error();
  RunOptions options = PruningOptions(OutDir("resumed"));
  options.resume_from = dir + "/checkpoints/round-001.h5";
  const StepLosses resumed = RunWithLosses(spec, options);
  ASSERT_EQ(resumed.summary.state(), topiary::v1::SUCCEEDED) << resumed.summary.error();
  ASSERT_FALSE(resumed.loss.empty());
  for (const auto& [step, loss] : resumed.loss) {
    ASSERT_EQ(full.loss.count(step), 1u) << "step " << step;
    ASSERT_EQ(loss, full.loss.at(step)) << "step " << step;  // exact
  }
  ASSERT_EQ(resumed.summary.rounds_size(), full.summary.rounds_size());
  for (int i = 0; i < full.summary.rounds_size(); ++i) {
    EXPECT_EQ(resumed.summary.rounds(i).multiply_adds(), full.summary.rounds(i).multiply_adds());
    EXPECT_EQ(resumed.summary.rounds(i).test_top1(), full.summary.rounds(i).test_top1());
  }
}

}  // namespace
}  // namespace topiary
