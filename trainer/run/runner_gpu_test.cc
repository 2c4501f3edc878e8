// The runner on a GPU. Tagged gpu: skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "trainer/core/device.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/run/runner.h"
#include "trainer/run/runner_test_util.h"
#include "trainer/spec/spec.h"

namespace topiary {
namespace {

using testing::Parse;
using testing::RunAndTrace;
using testing::SyntheticRun;
using testing::Trace;

topiary::v1::ExperimentSpec Synthetic() {
  return SyntheticRun(R"(
    train { lr_schedule { kind: COSINE warmup_epochs: 0.5 } }
    device { kind: CUDA threads: 0 deterministic: true })");
}

class RunnerGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (ListGpus(&why).empty()) GTEST_SKIP() << "no usable GPU: " << why;
  }
};

TEST_F(RunnerGpu, LearnsAndIsDeterministic) {
  const auto spec = Synthetic();
  const Trace a = RunAndTrace(spec), b = RunAndTrace(spec);
  ASSERT_EQ(a.summary.state(), topiary::v1::SUCCEEDED) << a.summary.error();
  EXPECT_NE(a.summary.device().find("cuda:0"), std::string::npos) << a.summary.device();
  EXPECT_GT(a.summary.test_top1(), 0.9);
  ASSERT_EQ(a.losses.size(), 60u);
  EXPECT_EQ(a.losses, b.losses);  // deterministic kernels and algorithms: bit-identical
}

TEST_F(RunnerGpu, GraphReplayEqualsEagerLaunches) {
  auto spec = Synthetic();
  spec.mutable_data()->mutable_augment()->set_crop_padding(1);
  spec.mutable_data()->mutable_augment()->set_horizontal_flip(true);
  const Trace graphs = RunAndTrace(spec);
  spec.mutable_device()->set_cuda_graphs(topiary::v1::DeviceSpec::GRAPHS_OFF);
  const Trace eager = RunAndTrace(spec);
  ASSERT_EQ(graphs.summary.state(), topiary::v1::SUCCEEDED) << graphs.summary.error();
  ASSERT_EQ(eager.summary.state(), topiary::v1::SUCCEEDED) << eager.summary.error();
  EXPECT_EQ(graphs.losses, eager.losses);
  EXPECT_EQ(graphs.summary.test_loss(), eager.summary.test_loss());
}

TEST_F(RunnerGpu, FirstStepMatchesCpu) {
  // Same initialization, same first batch: the first step's loss agrees to float rounding.
  auto spec = Synthetic();
  spec.mutable_train()->set_epochs(1);
  const Trace gpu = RunAndTrace(spec);
  spec.mutable_device()->set_kind(topiary::v1::DeviceSpec::CPU);
  const Trace cpu = RunAndTrace(spec);
  ASSERT_FALSE(gpu.losses.empty());
  ASSERT_FALSE(cpu.losses.empty());
  EXPECT_NEAR(gpu.losses[0], cpu.losses[0], 1e-4 * std::abs(cpu.losses[0]));
  // Later steps drift apart only by rounding; after an epoch both have learned alike.
  EXPECT_NEAR(gpu.losses.back(), cpu.losses.back(), 0.05 * std::abs(cpu.losses.back()) + 0.02);
}

TEST_F(RunnerGpu, ApproximateConvolutionsLearnDeterministicallyAndMatchTheCpu) {
  // Every conv through a multiplier table, moving-average ranges: the run learns, repeats
  // bit for bit, replays as a graph what it launches eagerly, and its first step (table
  // forward, straight-through backward) agrees with the CPU's.
  auto spec = Synthetic();
  auto* a = spec.mutable_approximation();
  a->add_rules()->set_layer("*");
  a->mutable_rules(0)->set_multiplier("drum:6");
  a->set_range(topiary::v1::ApproximationSpec::MOVING_AVERAGE);
  const Trace x = RunAndTrace(spec), y = RunAndTrace(spec);
  ASSERT_EQ(x.summary.state(), topiary::v1::SUCCEEDED) << x.summary.error();
  EXPECT_GT(x.summary.test_top1(), 0.9);
  EXPECT_EQ(x.losses, y.losses);
  auto eager = spec;
  eager.mutable_device()->set_cuda_graphs(topiary::v1::DeviceSpec::GRAPHS_OFF);
  EXPECT_EQ(RunAndTrace(eager).losses, x.losses);
  auto cpu = spec;
  cpu.mutable_device()->set_kind(topiary::v1::DeviceSpec::CPU);
  cpu.mutable_train()->set_epochs(1);
  const Trace c = RunAndTrace(cpu);
  ASSERT_FALSE(c.losses.empty());
  std::printf("first loss: GPU %.9g, CPU %.9g\n", x.losses[0], c.losses[0]);
  // Quantization turns the backends' last-bit differences upstream (batch norm, pooling) into
  // whole-code differences at rounding boundaries, so the agreement is looser than exact
  // convolutions' 1e-4.
  EXPECT_NEAR(x.losses[0], c.losses[0], 1e-2 * std::abs(c.losses[0]));
  // Sign-magnitude codes with per-channel scales: one parameter pair per output channel in
  // the layer's scratch, the backward pass's operands after them (cuDNN wants them aligned).
  auto sm = spec;
  sm.mutable_approximation()->set_weight_code(topiary::v1::ApproximationSpec::SIGN_MAGNITUDE);
  sm.mutable_approximation()->set_per_channel_weights(true);
  const Trace s1 = RunAndTrace(sm), s2 = RunAndTrace(sm);
  ASSERT_EQ(s1.summary.state(), topiary::v1::SUCCEEDED) << s1.summary.error();
  EXPECT_GT(s1.summary.test_top1(), 0.9);
  EXPECT_EQ(s1.losses, s2.losses);
  auto sm_cpu = sm;
  sm_cpu.mutable_device()->set_kind(topiary::v1::DeviceSpec::CPU);
  sm_cpu.mutable_train()->set_epochs(1);
  const Trace sc = RunAndTrace(sm_cpu);
  ASSERT_FALSE(sc.losses.empty());
  EXPECT_NEAR(s1.losses[0], sc.losses[0], 1e-2 * std::abs(sc.losses[0]));
  // BF16 is refused by validation, naming the field.
  auto bf16 = spec;
  bf16.mutable_train()->set_precision(topiary::v1::TrainSpec::BF16);
  EXPECT_NE(RunAndTrace(bf16).summary.error().find("train.precision: BF16 cannot be combined"),
            std::string::npos);
}

TEST_F(RunnerGpu, SampledWeightGradientsLearnDeterministicallyInFp32AndBf16) {
  // Top-2 sampled weight gradients on every other step (two captured graphs), with an
  // approximate layer too in fp32: the run learns, repeats bit for bit, replays as graphs
  // what it launches eagerly, and its first sampled step agrees with the CPU's.
  for (auto precision : {topiary::v1::TrainSpec::FP32, topiary::v1::TrainSpec::BF16}) {
    auto spec = Synthetic();
    spec.mutable_train()->set_precision(precision);
    auto* g = spec.mutable_gradient_sampling();
    g->set_top_k(2);
    g->set_every_n_steps(2);
    if (precision == topiary::v1::TrainSpec::FP32) {
      auto* a = spec.mutable_approximation();
      a->add_rules()->set_layer("stage2.block0.conv1");
      a->mutable_rules(0)->set_multiplier("drum:6");
    }
    const Trace x = RunAndTrace(spec), y = RunAndTrace(spec);
    ASSERT_EQ(x.summary.state(), topiary::v1::SUCCEEDED) << x.summary.error();
    std::printf("%s: top-1 %.4f, sampled steps %d of %d\n",
                topiary::v1::TrainSpec::Precision_Name(precision).c_str(), x.summary.test_top1(),
                static_cast<int>(x.summary.gradient_sampling().sampled_steps()),
                static_cast<int>(x.losses.size()));
    EXPECT_GT(x.summary.test_top1(), 0.9);
    EXPECT_EQ(x.summary.gradient_sampling().sampled_steps(), x.losses.size() / 2);
    EXPECT_EQ(x.losses, y.losses);
    auto eager = spec;
    eager.mutable_device()->set_cuda_graphs(topiary::v1::DeviceSpec::GRAPHS_OFF);
    EXPECT_EQ(RunAndTrace(eager).losses, x.losses);
    if (precision == topiary::v1::TrainSpec::FP32) {
      auto cpu = spec;
      cpu.clear_approximation();
      cpu.mutable_device()->set_kind(topiary::v1::DeviceSpec::CPU);
      cpu.mutable_train()->set_epochs(1);
      auto gpu = cpu;
      gpu.mutable_device()->set_kind(topiary::v1::DeviceSpec::CUDA);
      const Trace c = RunAndTrace(cpu), d = RunAndTrace(gpu);
      ASSERT_GT(c.losses.size(), 2u);
      ASSERT_EQ(c.losses.size(), d.losses.size());
      // Step 0 sampled, step 1 exact (after a sampled update): both agree with the CPU.
      std::printf("losses: GPU %.9g %.9g, CPU %.9g %.9g\n", d.losses[0], d.losses[1], c.losses[0],
                  c.losses[1]);
      EXPECT_NEAR(d.losses[0], c.losses[0], 1e-4 * std::abs(c.losses[0]));
      EXPECT_NEAR(d.losses[1], c.losses[1], 1e-3 * std::abs(c.losses[1]));
    }
  }
}

TEST_F(RunnerGpu, Bf16LearnsDeterministicallyAndHalvesActivations) {
  auto spec = Synthetic();
  spec.mutable_train()->set_precision(topiary::v1::TrainSpec::BF16);
  const Trace a = RunAndTrace(spec), b = RunAndTrace(spec);
  ASSERT_EQ(a.summary.state(), topiary::v1::SUCCEEDED) << a.summary.error();
  EXPECT_GT(a.summary.test_top1(), 0.9);
  ASSERT_EQ(a.losses.size(), 60u);
  EXPECT_EQ(a.losses, b.losses);
  // The first step sees the same weights and batch as fp32, rounded to bf16: close losses.
  const Trace fp32 = RunAndTrace(Synthetic());
  EXPECT_NEAR(a.losses[0], fp32.losses[0], 0.02 * std::abs(fp32.losses[0]));
  EXPECT_NE(a.losses, fp32.losses);  // and yet a different computation

  topiary::v1::DeviceSpec ds;
  ds.set_kind(topiary::v1::DeviceSpec::CUDA);
  auto dev = CreateDevice(ds);
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto model = BuildModel("resnet20", 1.0f, {1, 32, 32, 3}, 10, dev->get());
  ASSERT_TRUE(model.ok()) << model.status();
  PlanOptions bf16;
  bf16.precision = kernels::Precision::kBf16;
  auto n32 = Network::Plan(model->get(), 128, true);
  auto n16 = Network::Plan(model->get(), 128, true, bf16);
  ASSERT_TRUE(n32.ok()) << n32.status();
  ASSERT_TRUE(n16.ok()) << n16.status();
  EXPECT_EQ((*n16)->dtype(), kernels::DType::kBf16);
  EXPECT_LT((*n16)->planned_bytes(), 0.6 * (*n32)->planned_bytes());
}

TEST_F(RunnerGpu, ClearErrorsForMemoryAndDevice) {
  {
    topiary::v1::DeviceSpec ds;
    ds.set_kind(topiary::v1::DeviceSpec::CUDA);
    auto dev = CreateDevice(ds);
    ASSERT_TRUE(dev.ok()) << dev.status();
    auto model = BuildModel("resnet18", 1.0f, {1, 224, 224, 3}, 10, dev->get());
    ASSERT_TRUE(model.ok()) << model.status();
    auto net = Network::Plan(model->get(), 100000, true);
    ASSERT_FALSE(net.ok());
    const std::string msg(net.status().message());
    EXPECT_EQ(net.status().code(), absl::StatusCode::kResourceExhausted) << msg;
    EXPECT_NE(msg.find("planning resnet18 for batch 100000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("out of GPU memory"), std::string::npos) << msg;
  }
  // The process survives and the GPU is usable again.
  const auto ok = RunAndTrace(Synthetic()).summary;
  EXPECT_EQ(ok.state(), topiary::v1::SUCCEEDED) << ok.error();
  auto bad = Synthetic();
  bad.mutable_device()->add_gpus(63);  // a valid ordinal that no test machine has
  const auto s = RunAndTrace(bad).summary;
  EXPECT_NE(s.error().find("device.gpus: GPU 63 requested"), std::string::npos) << s.error();
}

}  // namespace
}  // namespace topiary
