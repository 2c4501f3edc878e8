#include "trainer/nn/model_zoo.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainer/nn/layers.h"

namespace topiary {
namespace {

// Small helpers so each architecture reads like its paper's table.
class Builder {
 public:
  Builder(Model* m, float width) : m_(m), width_(width) {}

  int Channels(int c) const { return std::max(1, static_cast<int>(std::lround(c * width_))); }

  int Conv(const std::string& name, int x, int out, int k, int stride, int pad, bool bias = false) {
    Conv2d::Config c;
    c.out_channels = out;
    c.kernel_h = c.kernel_w = k;
    c.stride = stride;
    c.pad = pad;
    c.bias = bias;
    return m_->Add(std::make_unique<Conv2d>(name, c), {x});
  }
  int Bn(const std::string& name, int x, bool relu) {
    return m_->Add(std::make_unique<BatchNorm2d>(name, relu), {x});
  }
  int Relu(const std::string& name, int x) {
    return m_->Add(std::make_unique<topiary::Relu>(name), {x});
  }
  int MaxPool(const std::string& name, int x, int k, int stride, int pad) {
    return m_->Add(std::make_unique<Pool2d>(name, Pool2d::Kind::kMax, k, stride, pad), {x});
  }
  // Residual add fused with the block's closing ReLU.
  int SumRelu(const std::string& name, int a, int b) {
    return m_->Add(std::make_unique<Add>(name, true), {a, b});
  }
  int Fc(const std::string& name, int x, int out) {
    return m_->Add(std::make_unique<Linear>(name, out), {x});
  }
  int GlobalPool(int x) { return m_->Add(std::make_unique<GlobalAvgPool>("pool"), {x}); }
  int FlattenAll(int x) { return m_->Add(std::make_unique<Flatten>("flatten"), {x}); }
  // conv -> bn (with the ReLU fused into the BN layer)
  int ConvBn(const std::string& prefix, const std::string& idx, int x, int out, int k, int stride,
             int pad, bool relu) {
    x = Conv(prefix + ".conv" + idx, x, out, k, stride, pad);
    return Bn(prefix + ".bn" + idx, x, relu);
  }
  // Identity, or 1x1 conv + BN when the block changes resolution or width.
  int Shortcut(const std::string& block, int x, int in_c, int out, int stride) {
    if (stride == 1 && in_c == out) return x;
    x = Conv(block + ".shortcut.conv", x, out, 1, stride, 0);
    return Bn(block + ".shortcut.bn", x, false);
  }
  int channels_of(int v) const { return m_->value_shapes()[v].c; }
  Model* model() { return m_; }

 private:
  Model* m_;
  float width_;
};

int BasicBlock(Builder& b, const std::string& name, int x, int out, int stride) {
  const int in_c = b.channels_of(x);
  int y = b.ConvBn(name, "1", x, out, 3, stride, 1, true);
  y = b.ConvBn(name, "2", y, out, 3, 1, 1, false);
  const int sc = b.Shortcut(name, x, in_c, out, stride);
  return b.SumRelu(name + ".add", y, sc);
}

int Bottleneck(Builder& b, const std::string& name, int x, int mid, int stride) {
  const int in_c = b.channels_of(x), out = mid * 4;
  int y = b.ConvBn(name, "1", x, mid, 1, 1, 0, true);
  y = b.ConvBn(name, "2", y, mid, 3, stride, 1, true);  // stride on the 3x3 (ResNet v1.5)
  y = b.ConvBn(name, "3", y, out, 1, 1, 0, false);
  const int sc = b.Shortcut(name, x, in_c, out, stride);
  return b.SumRelu(name + ".add", y, sc);
}

int LeNet5(Builder& b, int x, int classes) {
  x = b.Relu("relu1", b.Conv("conv1", x, b.Channels(6), 5, 1, 2, true));
  x = b.MaxPool("pool1", x, 2, 2, 0);
  x = b.Relu("relu2", b.Conv("conv2", x, b.Channels(16), 5, 1, 0, true));
  x = b.MaxPool("pool2", x, 2, 2, 0);
  x = b.FlattenAll(x);
  x = b.Relu("relu3", b.Fc("fc1", x, b.Channels(120)));
  x = b.Relu("relu4", b.Fc("fc2", x, b.Channels(84)));
  return b.Fc("fc", x, classes);
}

int CifarResNet(Builder& b, int x, int classes, int blocks_per_stage) {
  x = b.ConvBn("stem", "", x, b.Channels(16), 3, 1, 1, true);
  const int widths[3] = {16, 32, 64};
  for (int s = 0; s < 3; ++s) {
    for (int k = 0; k < blocks_per_stage; ++k) {
      const int stride = (s > 0 && k == 0) ? 2 : 1;
      x = BasicBlock(b, absl::StrCat("stage", s + 1, ".block", k), x, b.Channels(widths[s]),
                     stride);
    }
  }
  return b.Fc("fc", b.GlobalPool(x), classes);
}

int ImageNetResNet(Builder& b, int x, int classes, const std::vector<int>& blocks,
                   bool bottleneck) {
  x = b.ConvBn("stem", "", x, b.Channels(64), 7, 2, 3, true);
  x = b.MaxPool("stem.pool", x, 3, 2, 1);
  for (int s = 0; s < 4; ++s) {
    const int width = b.Channels(64 << s);
    for (int k = 0; k < blocks[s]; ++k) {
      const int stride = (s > 0 && k == 0) ? 2 : 1;
      const std::string name = absl::StrCat("stage", s + 1, ".block", k);
      x = bottleneck ? Bottleneck(b, name, x, width, stride)
                     : BasicBlock(b, name, x, width, stride);
    }
  }
  return b.Fc("fc", b.GlobalPool(x), classes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> BuildModel(const std::string& arch, float width,
                                                  Shape4 input, int classes, Device* device) {
  if (width <= 0.0f) width = 1.0f;
  auto model = std::make_unique<Model>(arch, device, input, classes);
  Builder b(model.get(), width);
  const int x = 0;
  int out = -1;
  const auto known = std::find_if(ModelArchs().begin(), ModelArchs().end(),
                                  [&](const ModelArch& a) { return arch == a.name; });
  if (known == ModelArchs().end()) {
    return absl::InvalidArgumentError("model.arch: unknown architecture '" + arch + "'; one of " +
                                      absl::StrJoin(ModelNames(), ", "));
  }
  switch (known->family) {
    case ModelArch::Family::kLeNet:
      out = LeNet5(b, x, classes);
      break;
    case ModelArch::Family::kCifarResNet:
      out = CifarResNet(b, x, classes, known->stage_blocks[0]);
      break;
    case ModelArch::Family::kImageNetResNet:
      out = ImageNetResNet(b, x, classes, known->stage_blocks, false);
      break;
    case ModelArch::Family::kImageNetBottleneck:
      out = ImageNetResNet(b, x, classes, known->stage_blocks, true);
      break;
  }
  if (auto st = model->Finish(out); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model.arch: ", arch, " does not fit ", input.h,
                                                   "x", input.w, "x", input.c,
                                                   " images: ", st.message()));
  }
  return model;
}

}  // namespace topiary
