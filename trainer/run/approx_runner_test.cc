// Training with approximate convolutions through the runner (CPU): the spec's rules reach
// the layers, checkpoints record each layer's multiplier and range state, a resumed run
// continues bit for bit, and bad rules fail naming the rule.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "trainer/run/approx_eval.h"
#include "trainer/run/runner_test_util.h"
#include "trainer/store/checkpoint.h"

namespace topiary {
namespace {

using testing::Parse;
using testing::RunAndTrace;
using testing::SyntheticRun;
using testing::TempDir;
using testing::Trace;

constexpr char kApprox[] = R"(
  seed: 5
  data { synthetic { height: 10 width: 10 classes: 4 train_size: 320 test_size: 128 } }
  train { epochs: 2 }
  checkpoints { every_epochs: 1 }
  approximation {
    rules { layer: "*" multiplier: "drum:4" }
    rules { layer: "stem.conv" exclude: true }
    rules { layer: "stage3.*" multiplier: "trunc:3" }
    range: MOVING_AVERAGE
    weight_tuning: true
    per_channel_weights: true
  }
)";

Trace RunTo(const topiary::v1::ExperimentSpec& spec, const std::string& out,
            const std::string& resume = "") {
  RunOptions opt;
  opt.out_dir = out;
  opt.resume_from = resume;
  return RunAndTrace(spec, opt);
}

TEST(ApproxRunner, TrainsRecordsMultipliersAndResumesExactly) {
  const auto spec = SyntheticRun(kApprox);
  const std::string out = TempDir("approx");
  const Trace full = RunTo(spec, out);
  ASSERT_EQ(full.summary.state(), topiary::v1::SUCCEEDED) << full.summary.error();
  ASSERT_EQ(full.losses.size(), 20u);  // 2 epochs x 10 steps

  auto doc = ReadCheckpointFile(out + "/checkpoints/epoch-0001.h5");
  ASSERT_TRUE(doc.ok()) << doc.status();
  const H5Attrs& conv = doc->groups.at("/layers/stage1.block0.conv1");
  EXPECT_EQ(std::get<std::string>(conv.at("multiplier")), "drum:4");
  EXPECT_EQ(std::get<std::string>(conv.at("multiplier_sha256")).size(), 64u);
  EXPECT_EQ(std::get<std::string>(conv.at("activation_range")), "moving_average");
  EXPECT_EQ(std::get<int64_t>(conv.at("weight_tuning")), 1);
  EXPECT_EQ(std::get<std::string>(conv.at("weight_scales")), "per_channel");
  EXPECT_EQ(std::get<std::string>(doc->groups.at("/layers/stage3.block2.conv2").at("multiplier")),
            "trunc:3");
  EXPECT_EQ(doc->groups.count("/layers/stem.conv") &&
                doc->groups.at("/layers/stem.conv").count("multiplier"),
            0u);  // excluded: exact
  const H5Dataset& range = doc->datasets.at("/layers/stage1.block0.conv1/activation_range");
  ASSERT_EQ(range.f32.size(), 3u);
  EXPECT_LT(range.f32[0], range.f32[1]);
  EXPECT_EQ(range.f32[2], 1.0f);  // observed
  EXPECT_EQ(doc->datasets.count("/layers/stem.conv/activation_range"), 0u);

  // Resumed after epoch 1: the second epoch's losses, bit for bit.
  const Trace resumed = RunTo(spec, TempDir("approx_resumed"), out + "/checkpoints/epoch-0001.h5");
  ASSERT_EQ(resumed.summary.state(), topiary::v1::SUCCEEDED) << resumed.summary.error();
  EXPECT_EQ(resumed.losses, std::vector<double>(full.losses.begin() + 10, full.losses.end()));
  EXPECT_EQ(resumed.summary.test_top1(), full.summary.test_top1());

  // Resuming with another multiplier is refused: it would not be the same run.
  auto other = spec;
  other.mutable_approximation()->mutable_rules(0)->set_multiplier("drum:5");
  const Trace refused = RunTo(other, TempDir("approx_other"), out + "/checkpoints/epoch-0001.h5");
  EXPECT_EQ(refused.summary.state(), topiary::v1::FAILED);
  EXPECT_NE(refused.summary.error().find("stage1.block0.conv1 was trained with multiplier"),
            std::string::npos)
      << refused.summary.error();
}

TEST(ApproxRunner, ExactTableTrainsLikeFakeQuantization) {
  // The exact table through the approximate path learns the synthetic classes like the exact
  // convolution does: quantization to 8 bits costs little on an easy task.
  auto spec = SyntheticRun(kApprox);
  spec.clear_checkpoints();
  spec.mutable_train()->set_epochs(4);
  auto* a = spec.mutable_approximation();
  a->clear_rules();
  a->add_rules()->set_layer("*");
  a->mutable_rules(0)->set_multiplier("exact");
  a->set_range(topiary::v1::ApproximationSpec::PER_BATCH);
  const Trace t = RunAndTrace(spec);
  ASSERT_EQ(t.summary.state(), topiary::v1::SUCCEEDED) << t.summary.error();
  EXPECT_GT(t.summary.test_top1(), 0.9);
  EXPECT_LT(t.losses.back(), t.losses.front());
}

TEST(ApproxRunner, BadRulesFailNamingTheRule) {
  const std::string bin = TempDir("short.bin");
  std::ofstream(bin) << std::string(1000, 'x');
  struct Case {
    std::string layer, multiplier, message;
  };
  const Case cases[] = {
      {"*", bin, "approximation.rules[0].multiplier: multiplier file " + bin},
      {"*", TempDir("missing.bin"), "approximation.rules[0].multiplier: "},
      {"*", "wallace", "approximation.rules[0].multiplier: "},
      {"*", "trunc:9", "approximation.rules[0].multiplier: "},
      {"stage9.*", "exact", "approximation.rules[0].layer: 'stage9.*' matches no convolution"},
  };
  for (const Case& c : cases) {
    auto spec = SyntheticRun(kApprox);
    auto* a = spec.mutable_approximation();
    a->clear_rules();
    a->add_rules()->set_layer(c.layer);
    a->mutable_rules(0)->set_multiplier(c.multiplier);
    const auto s = RunAndTrace(spec).summary;
    EXPECT_EQ(s.state(), topiary::v1::FAILED) << c.multiplier;
    EXPECT_NE(s.error().find(c.message), std::string::npos) << s.error();
  }
  // Caught by validation before anything runs.
  auto spec = SyntheticRun(kApprox);
  spec.mutable_train()->set_precision(topiary::v1::TrainSpec::BF16);
  EXPECT_NE(RunAndTrace(spec).summary.error().find("train.precision: BF16 cannot be combined"),
            std::string::npos);
  spec = SyntheticRun(kApprox);
  spec.mutable_approximation()->mutable_rules(0)->clear_multiplier();
  EXPECT_NE(RunAndTrace(spec).summary.error().find("approximation.rules[0].multiplier: required"),
            std::string::npos);
}

TEST(ApproxEval, EvaluatesCheckpointsUnderAssignmentsAndRanksLayers) {
  // An exact model, trained briefly; then its checkpoint evaluated without training.
  auto spec = SyntheticRun(kApprox);
  spec.clear_approximation();
  spec.clear_checkpoints();
  spec.mutable_train()->set_epochs(3);
  const std::string out = TempDir("eval");
  const Trace trained = RunTo(spec, out);
  ASSERT_EQ(trained.summary.state(), topiary::v1::SUCCEEDED) << trained.summary.error();
  auto ev = CheckpointEvaluator::Open(out + "/checkpoints/dense.h5");
  ASSERT_TRUE(ev.ok()) << ev.status();
  // Its own (empty) approximation: the run's own final evaluation, to the bit.
  auto own = (*ev)->Evaluate(std::nullopt);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->top1, trained.summary.test_top1());
  EXPECT_EQ(own->images, 128);
  // Every conv through the exact table: 8-bit fake quantization, close to the float model.
  topiary::v1::ApproximationSpec all;
  all.add_rules()->set_layer("*");
  all.mutable_rules(0)->set_multiplier("exact");
  auto quantized = (*ev)->Evaluate(all);
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  EXPECT_NEAR(quantized->top1, own->top1, 0.05);
  // A multiplier that drops 6 of 8 bits of both operands ruins it.
  all.mutable_rules(0)->set_multiplier("trunc:6");
  auto ruined = (*ev)->Evaluate(all);
  ASSERT_TRUE(ruined.ok()) << ruined.status();
  EXPECT_LT(ruined->top1, own->top1 - 0.2);

  // The error at the codes each layer uses: drum:4's asymmetric codes err far beyond its
  // table-wide figure on some layer; sign-magnitude codes (small magnitudes, where DRUM is
  // exact) on fewer, and with per-channel scales too.
  all.mutable_rules(0)->set_multiplier("drum:4");
  auto far_count = [&](bool sign_magnitude, bool per_channel) {
    all.set_weight_code(sign_magnitude ? topiary::v1::ApproximationSpec::SIGN_MAGNITUDE
                                       : topiary::v1::ApproximationSpec::ASYMMETRIC);
    all.set_per_channel_weights(per_channel);
    std::vector<CodeUse> use;
    auto r = (*ev)->Evaluate(all, &use);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(use.size(), 21u);
    int far = 0;
    for (const CodeUse& u : use) {
      EXPECT_EQ(u.multiplier, "drum:4");
      EXPECT_GT(u.table_error_pct, 0.0);
      far += u.far;
    }
    return far;
  };
  const int far_asymmetric = far_count(false, false);
  EXPECT_GT(far_asymmetric, 0);
  EXPECT_LT(far_count(true, false), far_asymmetric);
  EXPECT_LT(far_count(true, true), far_asymmetric);
  all.set_weight_code(topiary::v1::ApproximationSpec::ASYMMETRIC);
  all.set_per_channel_weights(false);

  const std::string l40 = "data/multipliers/evoapprox8b/mul8u_L40.bin";
  const std::string kem = "data/multipliers/evoapprox8b/mul8u_KEM.bin";
  int calls = 0;
  const topiary::v1::ApproximationSpec base = (*ev)->spec().approximation();
  auto report = Sensitivity(**ev, {kem, l40, "drum:4"}, 100.0, base, [&](int, int) { ++calls; });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->float_top1, 100.0 * own->top1);
  ASSERT_EQ(report->rows.size(), (*ev)->conv_layers().size());
  EXPECT_EQ(report->rows.size(), 21u);  // resnet20: 19 3x3 convs and 2 1x1 projections
  EXPECT_EQ(report->rows[0].layer.name, "stem.conv");
  EXPECT_EQ(report->rows[0].layer.macs, 10 * 10 * 8 * (3 * 3 * 2));  // width 0.5: 8 channels
  for (const auto& row : report->rows) {
    ASSERT_EQ(row.top1.size(), 3u);
    ASSERT_EQ(row.code_use.size(), 3u);
    EXPECT_EQ(row.code_use[2].layer, row.layer.name);
    EXPECT_EQ(row.code_use[2].multiplier, "drum:4");
  }
  EXPECT_EQ(report->unknown_power, std::vector<std::string>{"drum:4"});
  // A budget of 100 points takes every saving: each layer gets L40, the least power.
  EXPECT_EQ(report->assignment.size(), 21u);
  for (const auto& [layer, m] : report->assignment) EXPECT_EQ(m, 1) << layer;
  EXPECT_NEAR(report->relative_power, 0.189 / 0.391, 1e-9);
  EXPECT_GT(calls, 1 + 21 * 3);
  // No budget at all: nothing may change, the power stays that of the exact multiplier.
  auto strict = Sensitivity(**ev, {l40}, -1.0, base);
  ASSERT_TRUE(strict.ok()) << strict.status();
  EXPECT_TRUE(strict->assignment.empty());
  EXPECT_EQ(strict->relative_power, 1.0);
  EXPECT_EQ(strict->assigned_top1, strict->float_top1);
  // A bad multiplier is named.
  auto bad = Sensitivity(**ev, {"trunc:0"}, 1.0, base);
  EXPECT_NE(std::string(bad.status().message()).find("multiplier 1: "), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace topiary
