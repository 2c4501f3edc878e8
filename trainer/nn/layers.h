// The layers of the model zoo. Each one's forward and backward call the kernels of
// kernels/ for the device the network runs on.
#ifndef TOPIARY_TRAINER_NN_LAYERS_H_
#define TOPIARY_TRAINER_NN_LAYERS_H_

#include <optional>

#include "kernels/conv/conv.h"
#include "kernels/conv/grouped_conv.h"
#include "kernels/elementwise/activation.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/norm_pool/pooling.h"
#include "trainer/nn/conv_engine.h"
#include "trainer/nn/layer.h"

namespace topiary {

// 2-D convolution, groups = 1, filters [K, R, S, C] (parameter "kernel"), optional bias.
// Initialization: Kaiming normal, fan-out mode (torchvision's ResNet choice); bias uniform
// in +-1/sqrt(fan_in) (PyTorch's default). How it computes is its engine's business
// (conv_engine.h): exact unless Approximate() was called.
class Conv2d : public Layer {
 public:
  struct Config {
    int out_channels = 0;
    int kernel_h = 3, kernel_w = 3;
    int stride = 1;
    int pad = 0;
    bool bias = false;
  };
  Conv2d(std::string name, const Config& config)
      : Layer(std::move(name)), config_(config), engine_(MakeExactConvEngine()) {}
  LayerKind kind() const override { return LayerKind::kConv2d; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  void Initialize(Philox& rng) override;
  void Describe(topiary::v1::LayerNode* node) const override;
  absl::StatusOr<LayerResources> Prepare(int batch, Device* device,
                                         const PlanOptions& options) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {true, false}; }  // x for dW

  Parameter* kernel() const { return kernel_; }
  Parameter* bias() const { return bias_; }
  const Config& config() const { return config_; }
  kernels::ConvShape ShapeFor(int batch) const;

  // Makes the layer approximate, once, after Setup and before any network is planned. The
  // moving-average range mode adds the parameter activation_range [min, max, observed],
  // unobserved until the first training batch (checkpoints keep it).
  absl::Status Approximate(ConvApproximation approx, Device* device);
  // Null while the layer is exact.
  const ConvApproximation* approximation() const {
    return approximation_ ? &*approximation_ : nullptr;
  }

  // Lets the layer sample its weight gradient (before any network is planned: the workspace
  // grows); steps sample while SetSampling(true) is in force. Errors name the layer.
  absl::Status SampleWeightGradients(GradientSampling sampling);
  // Null when the weight gradient is always exact.
  const GradientSampling* gradient_sampling() const { return sampling_ ? &*sampling_ : nullptr; }
  // Whether the following backward passes sample (no effect on a layer that never does).
  void SetSampling(bool on) { sample_ = on; }

 private:
  ConvOperands Operands(int batch) const {
    return {name(), ShapeFor(batch), kernel_, bias_, sampling_ ? &*sampling_ : nullptr, sample_};
  }

  Config config_;
  Shape4 in_;
  Parameter* kernel_ = nullptr;
  Parameter* bias_ = nullptr;
  std::unique_ptr<ConvEngine> engine_;
  std::optional<ConvApproximation> approximation_;
  std::optional<GradientSampling> sampling_;
  bool sample_ = false;
};

// What Conv2d and GroupedConv2d share: the convolution `config` makes of input `in` for
// `batch` images, and the config's attributes in a graph node.
kernels::ConvShape ConvShapeOf(const Conv2d::Config& config, const Shape4& in, int batch);
void DescribeConvConfig(const Conv2d::Config& config, topiary::v1::LayerNode* node);

// Batch normalization per channel (gamma, beta, running_mean, running_var), PyTorch's
// semantics: momentum 0.1, eps 1e-5 (or the imported model's eps). With relu, fused with the
// ReLU that follows it.
class BatchNorm2d : public Layer {
 public:
  explicit BatchNorm2d(std::string name, bool relu = false, float eps = 1e-5f)
      : Layer(std::move(name)), relu_(relu), eps_(eps) {}
  LayerKind kind() const override { return LayerKind::kBatchNorm; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  void Initialize(Philox& rng) override;
  void Describe(topiary::v1::LayerNode* node) const override;
  absl::StatusOr<LayerResources> Prepare(int batch, Device* device,
                                         const PlanOptions& options) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  // x, and on the CPU y for the fused ReLU's mask (a GPU recomputes it from x).
  BackwardReads backward_reads(bool gpu) const override { return {true, relu_ && !gpu}; }
  bool fused_relu() const { return relu_; }
  // Folded into the pass that reads its output (a GPU network's residual tail,
  // trainer/nn/residual_tail.h): Forward without y, leaving the scale and shift of
  // y = x * scale + shift in scale_shift [2][C] (training: the batch's statistics, saved and
  // run as Forward does; inference: the running statistics). REQUIRES: a GPU, no fused ReLU.
  absl::Status ForwardFolded(const LayerIo& io, bool training, float* scale_shift);
  // The batch norm as the fused kernels read and write it in the pass of `io`.
  kernels::FoldedBatchNorm Folded(const LayerIo& io, const float* scale_shift) const;
  float eps() const { return eps_; }
  size_t channels() const { return static_cast<size_t>(in_.c); }

 private:
  kernels::BatchNormShape ShapeFor(int batch) const;
  bool relu_;
  float eps_;
  Shape4 in_;
  Parameter *gamma_ = nullptr, *beta_ = nullptr, *mean_ = nullptr, *var_ = nullptr;
};

// Fully connected: weight [out, in] ("kernel"), bias [out]. Inputs must be vectors (after
// Flatten or global pooling). PyTorch's default initialization (uniform +-1/sqrt(in)).
class Linear : public Layer {
 public:
  Linear(std::string name, int out_features) : Layer(std::move(name)), out_(out_features) {}
  LayerKind kind() const override { return LayerKind::kLinear; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  void Initialize(Philox& rng) override;
  void Describe(topiary::v1::LayerNode* node) const override;
  absl::StatusOr<LayerResources> Prepare(int batch, Device* device,
                                         const PlanOptions& options) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {true, false}; }

 private:
  int in_ = 0, out_ = 0;
  Parameter* kernel_ = nullptr;
  Parameter* bias_ = nullptr;
};

// Max or average pooling over windows (average counts padding as zeros).
class Pool2d : public Layer {
 public:
  enum class Kind { kMax, kAvg };
  Pool2d(std::string name, Kind kind, int window, int stride, int pad)
      : Layer(std::move(name)), kind_(kind), window_(window), stride_(stride), pad_(pad) {}
  LayerKind kind() const override {
    return kind_ == Kind::kMax ? LayerKind::kMaxPool : LayerKind::kAvgPool;
  }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  void Describe(topiary::v1::LayerNode* node) const override;
  absl::StatusOr<LayerResources> Prepare(int batch, Device* device,
                                         const PlanOptions& options) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  // On a GPU max pooling keeps the argmax of each window in its scratch.
  BackwardReads backward_reads(bool gpu) const override {
    return kind_ == Kind::kMax && !gpu ? BackwardReads{true, true} : BackwardReads{false, false};
  }
  int window() const { return window_; }
  int stride() const { return stride_; }
  int pad() const { return pad_; }

 private:
  kernels::PoolShape ShapeFor(int batch) const;
  Kind kind_;
  int window_, stride_, pad_;
  Shape4 in_;
};

// [N, H, W, C] -> [N, 1, 1, C] by averaging over all pixels.
class GlobalAvgPool : public Layer {
 public:
  explicit GlobalAvgPool(std::string name) : Layer(std::move(name)) {}
  LayerKind kind() const override { return LayerKind::kGlobalAvgPool; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {false, false}; }

 private:
  Shape4 in_;
};

// max(x, 0), or with six, ReLU6: min(max(x, 0), 6) (MobileNet's).
class Relu : public Layer {
 public:
  explicit Relu(std::string name, bool six = false) : Layer(std::move(name)), six_(six) {}
  LayerKind kind() const override { return six_ ? LayerKind::kRelu6 : LayerKind::kRelu; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {false, true}; }

 private:
  bool six_;
  Shape4 in_;
};

// Sigmoid, SiLU, leaky ReLU, hard sigmoid or hard swish (kernels/elementwise/activation.h):
// the activations of imported mobile networks. Unlike ReLU's, their backward reads the input.
class Activation : public Layer {
 public:
  // kind: kSigmoid, kSilu, kLeakyRelu (alpha), kHardSigmoid (alpha, beta) or kHardSwish.
  Activation(std::string name, LayerKind kind, float alpha = 0, float beta = 0);
  LayerKind kind() const override { return kind_; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  void Describe(topiary::v1::LayerNode* node) const override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {true, false}; }
  const kernels::ActivationFn& params() const { return params_; }

 private:
  LayerKind kind_;
  kernels::ActivationFn params_;
  Shape4 in_;
};

// The product of two inputs: of one shape, or a map [H, W, C] and a per-channel scale
// [1, 1, C] broadcast over its pixels (squeeze-and-excitation's gate), in either order.
class Mul : public Layer {
 public:
  explicit Mul(std::string name) : Layer(std::move(name)) {}
  LayerKind kind() const override { return LayerKind::kMul; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {true, false}; }

 private:
  Shape4 in_;       // the map's
  int pixels_ = 0;  // broadcast: the map's pixels per image; 0: one shape
  int map_ = 0;     // which input is the map (the other is the scale)
};

// Residual add of two inputs of the same shape; with relu, fused with the ReLU after it.
class Add : public Layer {
 public:
  explicit Add(std::string name, bool relu = false) : Layer(std::move(name)), relu_(relu) {}
  LayerKind kind() const override { return LayerKind::kAdd; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  void Describe(topiary::v1::LayerNode* node) const override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {false, relu_}; }
  // The fused add + ReLU backward reads dy once per element anyway: dy + dy2 costs one read.
  bool sums_output_gradients() const override { return relu_; }
  bool fused_relu() const { return relu_; }

 private:
  bool relu_;
  Shape4 in_;
};

// [N, H, W, C] -> [N, 1, 1, H*W*C] in NHWC order.
class Flatten : public Layer {
 public:
  explicit Flatten(std::string name) : Layer(std::move(name)) {}
  LayerKind kind() const override { return LayerKind::kFlatten; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {false, false}; }

 private:
  Shape4 in_;
};

// Concatenation of two or more inputs of the same height and width along channels, in input
// order (Inception's and DenseNet's merge).
class Concat : public Layer {
 public:
  explicit Concat(std::string name) : Layer(std::move(name)) {}
  LayerKind kind() const override { return LayerKind::kConcat; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {false, false}; }

 private:
  std::vector<int> channels_;  // per input
  Shape4 out_;
};

// Grouped convolution (groups > 1; depthwise when groups = input channels), filters
// [K, R, S, C / groups] (parameter "kernel", OIHW [K, C / groups, R, S] on disk), optional
// bias. Exact only, on direct kernels (kernels/conv/grouped_conv.h): block pruning, approximation
// and sampled gradients apply to Conv2d, not here. Initialization as Conv2d's.
class GroupedConv2d : public Layer {
 public:
  GroupedConv2d(std::string name, const Conv2d::Config& config, int groups)
      : Layer(std::move(name)), config_(config), groups_(groups) {}
  LayerKind kind() const override { return LayerKind::kGroupedConv2d; }
  absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) override;
  void Initialize(Philox& rng) override;
  void Describe(topiary::v1::LayerNode* node) const override;
  absl::Status Forward(const LayerIo& io, bool training) override;
  absl::Status Backward(const LayerIo& io) override;
  BackwardReads backward_reads(bool) const override { return {true, false}; }  // x for dW

  const Conv2d::Config& config() const { return config_; }
  int groups() const { return groups_; }
  kernels::GroupedConvShape ShapeFor(int batch) const;

 private:
  Conv2d::Config config_;
  int groups_;
  Shape4 in_;
  Parameter* kernel_ = nullptr;
  Parameter* bias_ = nullptr;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_LAYERS_H_
