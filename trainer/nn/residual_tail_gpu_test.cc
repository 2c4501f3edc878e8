// Fused residual tails (trainer/nn/residual_tail.h) against the same model's layers run one by
// one, on a GPU: resnet20 (identity and projection shortcuts of basic blocks) and a narrow
// resnet50 (bottlenecks), fp32 and bf16, a training step and inference. Tagged gpu: skips,
// saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/core/device.h"
#include "trainer/core/random.h"
#include "trainer/nn/model.h"
#include "trainer/nn/model_zoo.h"

namespace topiary {
namespace {

// max |a - b| / max |b|
double Rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return err / scale;
}

struct Step {
  std::vector<float> logits, eval_logits;
  std::vector<std::vector<float>> grads, running;
  double loss = 0;
};

bool IsRunningStatistic(const Parameter* p) {
  return p->role == ParamRole::kRunningMean || p->role == ParamRole::kRunningVar;
}

class ResidualTailGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (ListGpus(&why).empty()) GTEST_SKIP() << "no usable GPU: " << why;
    topiary::v1::DeviceSpec ds;
    ds.set_kind(topiary::v1::DeviceSpec::CUDA);
    auto dev = CreateDevice(ds);
    ASSERT_TRUE(dev.ok()) << dev.status();
    device_ = std::move(*dev);
  }

  // Batch norms with random parameters and running statistics (the zoo's start, gamma 1 and
  // beta 0, would hide a mixed-up scale or shift), kept to be restored before each run.
  // (randomize false: only kept, at the zoo's start.)
  void Randomize(Model* model, bool randomize = true) {
    Philox rng(9, RngStream::kInit);
    saved_.clear();
    for (Parameter* p : model->parameters()) {
      std::vector<float> v = p->value.ToHost();
      const bool bn =
          p->role == ParamRole::kGamma || p->role == ParamRole::kBeta || IsRunningStatistic(p);
      if (bn && randomize) {
        for (float& x : v) {
          x = p->role == ParamRole::kRunningVar || p->role == ParamRole::kGamma
                  ? 0.5f + rng.Uniform()
                  : rng.Uniform() - 0.5f;
        }
        p->value.CopyFromHost(v.data());
      }
      if (IsRunningStatistic(p)) saved_.push_back({p, v});
    }
  }

  // One training step's logits, loss, parameter gradients and running statistics, then
  // inference logits, from the same weights, running statistics and batch.
  Step Run(Model* model, int batch, kernels::Precision precision, bool fuse, bool moments = false,
           bool deterministic = true) {
    auto restore = [&] {
      for (auto& [p, v] : saved_) p->value.CopyFromHost(v.data());
    };
    restore();
    PlanOptions options;
    options.precision = precision;
    options.deterministic = deterministic;
    options.fuse_residual_tails = fuse;
    options.fuse_batch_norm_moments = moments;
    auto net = Network::Plan(model, batch, true, options);
    EXPECT_TRUE(net.ok()) << net.status();
    if (!net.ok()) return {};
    Network& n = **net;
    // The plan report names each add's fusion, or why it runs unfused.
    int fused_adds = 0, folded = 0;
    moment_convs_ = moment_norms_ = 0;
    for (const std::string& line : n.PlanReport()) {
      fused_adds += line.find("(add): fused residual tail: ") != std::string::npos;
      folded +=
          line.find("(batch_norm): folded into the fused residual tail of ") != std::string::npos;
      if (!fuse && line.find("(add)") != std::string::npos) {
        EXPECT_NE(line.find("unfused: residual tails are not fused"), std::string::npos) << line;
      }
    }
    EXPECT_EQ(fused_adds, fuse ? n.residual_tails() : 0);
    EXPECT_GE(folded, fused_adds);
    for (const std::string& line : n.PlanReport()) {
      moment_convs_ += line.find("forward with its batch norm's moments") != std::string::npos;
      moment_norms_ += line.find("training statistics from ") != std::string::npos;
    }
    const Shape4 in = model->input_shape();
    std::vector<float> x(static_cast<size_t>(batch) * in.per_image());
    Philox rng(5, RngStream::kData);
    for (float& v : x) v = rng.Normal();
    std::vector<int32_t> labels(batch);
    for (int i = 0; i < batch; ++i) labels[i] = i % model->classes();
    device_->CopyFromHost(n.input(), x.data(), x.size() * sizeof(float));
    device_->CopyFromHost(n.labels(), labels.data(), labels.size() * sizeof(int32_t));
    Step s;
    const size_t logits = static_cast<size_t>(batch) * model->classes();
    auto read_logits = [&] {
      std::vector<float> out(logits);
      if (n.dtype() == kernels::DType::kF32) {
        device_->CopyToHost(out.data(), n.logits(), logits * sizeof(float));
        return out;
      }
      std::vector<kernels::Bf16> b(logits);
      device_->CopyToHost(b.data(), n.logits(), logits * sizeof(kernels::Bf16));
      for (size_t i = 0; i < logits; ++i) out[i] = kernels::FromBf16(b[i]);
      return out;
    };
    EXPECT_TRUE(n.Forward(true).ok());
    s.logits = read_logits();  // before the backward pass reuses its memory
    EXPECT_TRUE(n.Loss(0.0f).ok());
    EXPECT_TRUE(n.Backward().ok());
    auto metrics = n.TakeMetrics();
    EXPECT_TRUE(metrics.ok());
    s.loss = metrics.ok() ? metrics->loss() : 0;
    for (Parameter* p : model->parameters()) {
      if (p->trainable) s.grads.push_back(p->grad.ToHost());
      if (IsRunningStatistic(p)) s.running.push_back(p->value.ToHost());
    }
    restore();
    EXPECT_TRUE(n.Forward(false).ok());
    s.eval_logits = read_logits();
    return s;
  }

  std::unique_ptr<Device> device_;
  std::vector<std::pair<Parameter*, std::vector<float>>> saved_;
  // Plan-report lines of the last Run: convolutions writing their batch norms' moments, and
  // batch norms reading them.
  int moment_convs_ = 0, moment_norms_ = 0;
};

TEST_F(ResidualTailGpu, FusedNetworksComputeWhatTheLayersCompute) {
  struct Case {
    const char* arch;
    float width;
    int hw, batch;
  };
  for (const Case& c : {Case{"resnet20", 1.0f, 32, 8}, Case{"resnet50", 0.25f, 64, 3}}) {
    for (auto precision : {kernels::Precision::kFp32, kernels::Precision::kBf16}) {
      const bool bf16 = precision == kernels::Precision::kBf16;
      SCOPED_TRACE(std::string(c.arch) + (bf16 ? " bf16" : " fp32"));
      auto model = BuildModel(c.arch, c.width, {1, c.hw, c.hw, 3}, 10, device_.get());
      ASSERT_TRUE(model.ok()) << model.status();
      (*model)->Initialize(3);
      Randomize(model->get());
      const Step fused = Run(model->get(), c.batch, precision, true);
      const Step layers = Run(model->get(), c.batch, precision, false);
      ASSERT_EQ(fused.grads.size(), layers.grads.size());
      // Forward: the tail rounds as the layers store; the statistics are the same kernels'.
      EXPECT_LT(Rel(fused.logits, layers.logits), bf16 ? 1e-2 : 1e-5);
      EXPECT_NEAR(fused.loss, layers.loss, (bf16 ? 1e-2 : 1e-5) * std::abs(layers.loss));
      double worst = 0;
      for (size_t i = 0; i < fused.grads.size(); ++i) {
        worst = std::max(worst, Rel(fused.grads[i], layers.grads[i]));
      }
      EXPECT_LT(worst, bf16 ? 5e-2 : 1e-3);
      ASSERT_EQ(fused.running.size(), layers.running.size());
      for (size_t i = 0; i < fused.running.size(); ++i) {
        EXPECT_EQ(fused.running[i], layers.running[i]) << i;  // the same statistics kernels
      }
      // Inference folds the running statistics into a scale and shift: rounding only.
      EXPECT_LT(Rel(fused.eval_logits, layers.eval_logits), bf16 ? 2e-2 : 1e-4);
    }
  }
}

// Convolutions writing their batch norms' moments from a Hopper kernel's epilogue
// (trainer/nn/moments_dispatch.h, forced with TOPIARY_CONV_MOMENTS=on) train as the batch
// norms computing their own statistics do: a narrow bf16 resnet50 with fused tails, at the
// zoo's start and with random batch-norm parameters. The moments are y's own, so the first
// batch norm given them agrees to the order of fp32 sums (4e-8 measured). Past it the two
// networks differ as any two roundings of one do: a network at initialization with batch
// norms over few values per channel amplifies a difference in the last bits to percents
// (measured on an H200: the same y with the batch norms' own statistics against the moments,
// 1e-7 apart, moves the logits by 1-3% and the gradients by 35-60%; cuDNN's y against the
// Hopper kernel's, each with its own statistics, by 0.5% and 4-9%). So the later layers are
// held to bounds that garbage or a batch norm given another convolution's moments would
// break, not to rounding. Needs an sm_90 GPU.
TEST_F(ResidualTailGpu, BatchNormMomentsFromConvolutionsTrainAsTheBatchNormsOwn) {
  for (bool randomize : {false, true}) {
    SCOPED_TRACE(randomize ? "random batch norms" : "the zoo's start");
    auto model = BuildModel("resnet50", 0.25f, {1, 128, 128, 3}, 10, device_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    (*model)->Initialize(3);
    Randomize(model->get(), randomize);
    const kernels::Precision bf16 = kernels::Precision::kBf16;
    const int batch = 8;
    const Step own = Run(model->get(), batch, bf16, true, false);
    EXPECT_EQ(moment_convs_, 0);
    EXPECT_EQ(moment_norms_, 0);
    setenv("TOPIARY_CONV_MOMENTS", "on", 1);
    const Step given = Run(model->get(), batch, bf16, true, true);
    unsetenv("TOPIARY_CONV_MOMENTS");
    // Every convolution feeds a batch norm alone; the Hopper kernels take those whose
    // channels are multiples of 64 (not the stem's 3, nor layer1's 16 at this width).
    EXPECT_EQ(moment_norms_, 53);
    if (moment_convs_ == 0) GTEST_SKIP() << "no convolution took the Hopper kernels (not sm_90?)";
    EXPECT_LT(moment_convs_, 53);
    const double logits = Rel(given.logits, own.logits);
    // The gradients as one vector (a parameter whose gradient is near 0 everywhere would make
    // the largest per-parameter difference meaningless): relative Euclidean distance.
    double diff2 = 0, norm2 = 0, first = -1, running = 0;
    ASSERT_EQ(given.grads.size(), own.grads.size());
    for (size_t i = 0; i < given.grads.size(); ++i) {
      for (size_t j = 0; j < own.grads[i].size(); ++j) {
        const double d = static_cast<double>(given.grads[i][j]) - own.grads[i][j];
        diff2 += d * d;
        norm2 += static_cast<double>(own.grads[i][j]) * own.grads[i][j];
      }
    }
    const double grads = std::sqrt(diff2 / std::max(norm2, 1e-30));
    ASSERT_EQ(given.running.size(), own.running.size());
    for (size_t i = 0; i < given.running.size(); ++i) {
      const double r = Rel(given.running[i], own.running[i]);
      if (first < 0 && r > 0) first = r;  // the first batch norm given moments
      running = std::max(running, r);
    }
    std::printf(
        "moments against own statistics: logits %.2e, loss %.5f / %.5f, gradients %.2e, running "
        "statistics %.2e (the first that differ %.2e)\n",
        logits, given.loss, own.loss, grads, running, first);
    EXPECT_GT(first, 0);
    EXPECT_LT(first, 1e-6);
    EXPECT_LT(running, 5e-2);
    EXPECT_LT(logits, 6e-2);
    EXPECT_NEAR(given.loss, own.loss, 1e-2 * std::abs(own.loss));
    EXPECT_LT(grads, 1.5);
  }
}

}  // namespace
}  // namespace topiary
