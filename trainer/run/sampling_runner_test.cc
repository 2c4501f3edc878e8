// Training with sampled weight gradients through the runner (CPU): the spec's selection and
// step policy reach the layers, warm-up steps are exact, events, summary and checkpoints say
// which layers and steps sampled, a resumed run continues bit for bit, keeping every position
// trains as the exact gradient does, and bad selections fail naming the field.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "trainer/run/runner_test_util.h"
#include "trainer/store/checkpoint.h"

namespace topiary {
namespace {

using testing::Parse;
using testing::SyntheticRun;
using testing::TempDir;

// The shared run on 10x10 images of 4 classes (320 to train, 128 to test), a checkpoint
// per epoch.
constexpr char kBase[] = R"(
  data { synthetic { height: 10 width: 10 classes: 4 train_size: 320 test_size: 128 } }
  checkpoints { every_epochs: 1 }
)";

struct Recorded {
  std::vector<double> losses;
  std::vector<int> sampled_per_epoch;
  topiary::v1::GradientSamplingReport started;
  topiary::v1::RunSummary summary;
};

Recorded Train(const std::string& extra, const std::string& out = "",
               const std::string& resume = "") {
  Recorded r;
  RunOptions opt;
  opt.out_dir = out;
  opt.resume_from = resume;
  opt.progress_interval_s = 0;
  opt.on_event = [&](const topiary::v1::Event& e) {
    if (e.has_progress()) r.losses.push_back(e.progress().loss());
    if (e.has_epoch()) r.sampled_per_epoch.push_back(e.epoch().sampled_steps());
    if (e.has_started()) r.started = e.started().gradient_sampling();
  };
  r.summary = RunExperiment(SyntheticRun(std::string(kBase) + extra), opt);
  return r;
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, 0.0) / (end - begin);
}

TEST(SamplingRunner, ReferencePolicyWarmsUpSamplesReportsAndResumesExactly) {
  const std::string policy =
      "gradient_sampling { every_other: true top_k: 2 probability: 0.5 warmup_epochs: 1 }";
  const std::string out = TempDir("sampled");
  const Recorded full = Train(policy, out);
  ASSERT_EQ(full.summary.state(), topiary::v1::SUCCEEDED) << full.summary.error();
  ASSERT_EQ(full.losses.size(), 30u);  // 3 epochs x 10 steps

  // Every other one of resnet20's 19 3x3 convolutions, starting with the stem.
  ASSERT_EQ(full.started.layers_size(), 10);
  EXPECT_EQ(full.started.layers(0), "stem.conv");
  EXPECT_EQ(full.started.layers(1), "stage1.block0.conv2");
  EXPECT_EQ(full.started.top_k(), 2);
  EXPECT_EQ(full.started.scale(), topiary::v1::GradientSamplingSpec::UNBIASED);
  EXPECT_EQ(full.started.policy(), "probability 0.5 after 1 warm-up epoch");

  // The warm-up epoch is exact; the others sample some steps, not all.
  ASSERT_EQ(full.sampled_per_epoch.size(), 3u);
  EXPECT_EQ(full.sampled_per_epoch[0], 0);
  for (int e : {1, 2}) {
    EXPECT_GT(full.sampled_per_epoch[e], 0);
    EXPECT_LT(full.sampled_per_epoch[e], 10);
  }
  const auto& g = full.summary.gradient_sampling();
  EXPECT_EQ(g.sampled_steps(), full.sampled_per_epoch[1] + full.sampled_per_epoch[2]);
  EXPECT_EQ(g.sampled_steps() + g.exact_steps(), 30);
  EXPECT_EQ(g.layers_size(), 10);

  // Against the exact run: the same warm-up epoch bit for bit, then different losses, and
  // learning all the same.
  const Recorded exact = Train("");
  ASSERT_EQ(exact.losses.size(), 30u);
  EXPECT_EQ(std::vector<double>(full.losses.begin(), full.losses.begin() + 10),
            std::vector<double>(exact.losses.begin(), exact.losses.begin() + 10));
  EXPECT_NE(full.losses, exact.losses);
  EXPECT_FALSE(exact.summary.has_gradient_sampling());
  EXPECT_LT(Mean(full.losses, 20, 30), Mean(full.losses, 0, 10));

  // Checkpoints say which layers sampled, and how.
  auto doc = ReadCheckpointFile(out + "/checkpoints/epoch-0001.h5");
  ASSERT_TRUE(doc.ok()) << doc.status();
  const H5Attrs& stem = doc->groups.at("/layers/stem.conv");
  EXPECT_EQ(std::get<std::string>(stem.at("weight_gradient")), "sampled");
  EXPECT_EQ(std::get<int64_t>(stem.at("weight_gradient_top_k")), 2);
  EXPECT_EQ(std::get<std::string>(stem.at("weight_gradient_scale")), "unbiased");
  EXPECT_EQ(doc->groups.count("/layers/stage1.block0.conv1") &&
                doc->groups.at("/layers/stage1.block0.conv1").count("weight_gradient"),
            0u);

  // Resumed after epoch 1: the same draws, the same losses, the same counts.
  const Recorded resumed =
      Train(policy, TempDir("sampled_resumed"), out + "/checkpoints/epoch-0001.h5");
  ASSERT_EQ(resumed.summary.state(), topiary::v1::SUCCEEDED) << resumed.summary.error();
  EXPECT_EQ(resumed.losses, std::vector<double>(full.losses.begin() + 10, full.losses.end()));
  EXPECT_EQ(resumed.summary.gradient_sampling().sampled_steps(), g.sampled_steps());
  EXPECT_EQ(resumed.summary.gradient_sampling().exact_steps(), g.exact_steps());
  EXPECT_EQ(resumed.summary.test_top1(), full.summary.test_top1());
}

TEST(SamplingRunner, StepPoliciesSampleTheStepsTheySay) {
  const Recorded every_third = Train("gradient_sampling { every_n_steps: 3 }");
  ASSERT_EQ(every_third.summary.state(), topiary::v1::SUCCEEDED) << every_third.summary.error();
  EXPECT_EQ(every_third.sampled_per_epoch, (std::vector<int>{4, 4, 4}));  // steps 0, 3, 6, 9
  EXPECT_EQ(every_third.started.layers_size(), 21);  // every conv, 1x1 shortcuts included
  EXPECT_EQ(every_third.started.policy(), "every 3 steps");

  const Recorded alternate =
      Train("gradient_sampling { layers: 'stage3.*' exclude: '*.conv2' alternate_epochs: true }");
  ASSERT_EQ(alternate.summary.state(), topiary::v1::SUCCEEDED) << alternate.summary.error();
  EXPECT_EQ(alternate.sampled_per_epoch, (std::vector<int>{10, 0, 10}));
  for (const std::string& layer : alternate.started.layers()) {
    EXPECT_EQ(layer.rfind("stage3.", 0), 0u) << layer;
    EXPECT_EQ(layer.find("conv2"), std::string::npos) << layer;
  }

  const Recorded always = Train("gradient_sampling { top_k: 3 scale: REFERENCE }");
  EXPECT_EQ(always.sampled_per_epoch, (std::vector<int>{10, 10, 10}));
  EXPECT_EQ(always.started.scale(), topiary::v1::GradientSamplingSpec::REFERENCE);
  EXPECT_EQ(always.started.policy(), "every step");
}

TEST(SamplingRunner, KeepingEveryPositionTrainsAsTheExactGradientDoes) {
  // top_k beyond every layer's Ho*Wo: the sampled gradient is the exact one, summed in another
  // order, so the trajectory stays within float rounding of the exact run's for a while.
  const Recorded all = Train("gradient_sampling { top_k: 1000 }");
  const Recorded exact = Train("");
  ASSERT_EQ(all.losses.size(), exact.losses.size());
  EXPECT_NE(all.losses, exact.losses);  // the sampled kernels did run
  // The rounding difference compounds step by step (how fast depends on the order oneDNN's
  // kernel of the day sums in: the strided 1x1 shortcuts' filter gradients moved off its
  // jit_1x1 kernels, conv_onednn.cc), so the bound widens after the first steps.
  for (size_t i = 0; i < 10; ++i) {
    const double tolerance = i < 5 ? 1e-3 : 3e-2;
    EXPECT_NEAR(all.losses[i], exact.losses[i], tolerance * exact.losses[i]) << "step " << i;
  }
}

TEST(SamplingRunner, BadSelectionsFailNamingTheField) {
  const Recorded typo = Train("gradient_sampling { layers: 'stage9.*' }");
  EXPECT_EQ(typo.summary.state(), topiary::v1::FAILED);
  EXPECT_EQ(typo.summary.error(),
            "gradient_sampling.layers[0]: 'stage9.*' matches no convolution of resnet20");
  const Recorded exclude = Train("gradient_sampling { exclude: 'nope' }");
  EXPECT_EQ(exclude.summary.error(),
            "gradient_sampling.exclude[0]: 'nope' matches no convolution of resnet20");
  const Recorded none = Train("gradient_sampling { exclude: '*' }");
  EXPECT_EQ(none.summary.error(), "gradient_sampling: selects no convolution of resnet20");
}

}  // namespace
}  // namespace topiary
