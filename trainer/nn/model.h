// Model: layers in topological order, the values they read and write, and the parameters.
// Built once (by the model zoo); planned into Networks for concrete batch sizes.
#ifndef TOPIARY_TRAINER_NN_MODEL_H_
#define TOPIARY_TRAINER_NN_MODEL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/elementwise/elementwise.h"
#include "trainer/core/tensor.h"
#include "trainer/nn/layer.h"

namespace topiary {

class ResidualTail;

class Model {
 public:
  struct Node {
    Layer* layer;
    std::vector<int> inputs;  // value ids
    int output;               // value id
  };

  // Value 0 is the input image [1, H, W, C]. Parameters are created on `device`.
  Model(std::string arch, Device* device, Shape4 input, int classes);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Appends a layer reading `inputs` and returns its output value id. Errors (bad shapes,
  // duplicate names) are remembered and returned by Finish(); later calls then do nothing.
  int Add(std::unique_ptr<Layer> layer, std::vector<int> inputs);
  // The first error of an Add, if any.
  const absl::Status& status() const { return status_; }
  // Declares the logits value. Fails when an Add failed or the output is not [classes].
  absl::Status Finish(int output);

  // Draws every parameter from the init stream of `seed` (layer by layer, in order).
  void Initialize(uint64_t seed);

  const std::string& arch() const { return arch_; }
  Device* device() const { return device_; }
  const Shape4& input_shape() const { return shapes_[0]; }
  int classes() const { return classes_; }
  int output() const { return output_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Shape4>& value_shapes() const { return shapes_; }
  std::vector<Parameter*> parameters() const;
  int64_t trainable_parameter_count() const;
  Layer* FindLayer(const std::string& name) const;

  // A layer's out_channels before channel pruning removed any (0: none removed); the network
  // graph carries it (LayerNode.original_out_channels) through compaction and checkpoints.
  int original_out_channels(const std::string& layer) const;
  void set_original_out_channels(const std::string& layer, int channels);

 private:
  std::string arch_;
  Device* device_;
  int classes_;
  int output_ = -1;
  absl::Status status_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Node> nodes_;
  std::vector<Shape4> shapes_;  // per value, batch 1
  std::map<std::string, int> original_out_channels_;
};

// Running sums of the loss and accuracy over the batches since the last TakeMetrics().
struct Metrics {
  double loss_sum = 0, top1 = 0, top5 = 0, images = 0;
  double loss() const { return images > 0 ? loss_sum / images : 0; }
  double top1_rate() const { return images > 0 ? top1 / images : 0; }
  double top5_rate() const { return images > 0 ? top5 / images : 0; }
};

// Receives each layer's parameter gradients as Backward writes them: data parallelism's
// gradient averaging (trainer/dist/gradient_sync.h), which overlaps the rest of the backward
// pass. A network with a reducer leaves a bf16 network's gradient widening to it.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // Node `node` (index in Model::nodes()) has written its parameters' gradients.
  virtual absl::Status LayerDone(int node) = 0;
  // After the last layer: every gradient is final when the work enqueued so far is done.
  virtual absl::Status Finish() = 0;
};

// A model planned for one batch size on the model's device: every activation, gradient,
// saved statistic, workspace and library plan is made here, once, so a training step
// allocates nothing and, on a GPU, never waits for the host (and can be captured as a CUDA
// graph).
class Network {
 public:
  // training = false plans inference only (no gradients).
  static absl::StatusOr<std::unique_ptr<Network>> Plan(Model* model, int batch, bool training,
                                                       const PlanOptions& options = {});
  ~Network();

  int batch() const { return batch_; }
  // The element type of activations and their gradients (bf16 when planned with
  // Precision::kBf16, which needs a GPU).
  kernels::DType dtype() const { return dtype_; }
  // The input batch [batch, H, W, C] (fp32 whatever dtype(): a bf16 network casts it) and
  // its labels [batch], in device memory: write them before Forward.
  float* input() const { return input_; }
  int32_t* labels() const { return labels_.data(); }
  // The logits [batch, classes] of the last Forward, in device memory, of type dtype().
  const void* logits() const { return values_[model_->output()].data; }

  // count_input_zeros > 0 also counts, for every convolution, the exact zeros among the first
  // count_input_zeros images of its input (activation sparsity, the zeros that input-sparse
  // kernels such as cuSNN's exploit); TakeConvInputZeros reads the counts.
  absl::Status Forward(bool training, int count_input_zeros = 0);
  // Softmax cross-entropy of the logits against labels(). A training network also writes its
  // gradient (mean over the batch), which Backward propagates into every parameter's grad.
  // The loss and top-1/top-5 hits of the first `count` images (default: all; a training
  // network requires all) are added to the running metrics.
  absl::Status Loss(float label_smoothing, int count = -1);
  // REQUIRES: a training network; Forward(true) and Loss ran for this batch.
  absl::Status Backward();
  // The metrics accumulated since the last call, then reset. Waits for the device.
  absl::StatusOr<Metrics> TakeMetrics();

  // Per convolution, in model order: (layer name, zero fraction of the inputs counted since
  // the last call); then resets the counts. Waits for the device.
  absl::StatusOr<std::vector<std::pair<std::string, double>>> TakeConvInputZeros();

  // Each block-masked convolution's measured choice between block-sparse and dense kernels
  // (layer name, choice), in model order; empty on the CPU and before a step has run with a
  // block mask.
  std::vector<std::pair<std::string, SparseConvChoice>> SparseConvChoices() const;

  // How many residual tails run fused (trainer/nn/residual_tail.h), and whether node `node`
  // (its add or a folded batch norm) is in one.
  int residual_tails() const { return static_cast<int>(tails_.size()); }
  bool in_residual_tail(int node) const { return tail_of_[node] >= 0; }

  // One line per layer, in model order: "name (type): what runs it": each convolution pass's
  // kernel (cuDNN's, or Topiary's direct or block-sparse kernels) and how it was chosen, an
  // approximate layer's multiplier, the batch norms folded into fused residual tails, and
  // for an add that runs unfused in a GPU network, why.
  std::vector<std::string> PlanReport() const;

  // Bytes of activations, gradients, scratch and workspace planned for this network.
  size_t planned_bytes() const { return planned_bytes_; }
  // The part of it that holds activations and their gradients.
  size_t activation_bytes() const { return arena_.size(); }
  // How planning went: layers, how convolution algorithms were chosen, seconds.
  const PlanProgress& plan_progress() const { return plan_progress_; }

  // For profiling: called after each layer's forward (backward = false) and backward pass
  // with the layer's index in model().nodes(). Not for use while capturing a CUDA graph.
  using LayerHook = std::function<absl::Status(int node, bool backward)>;
  void set_layer_hook(LayerHook hook) { hook_ = std::move(hook); }
  // For diagnostics: called before each layer's forward pass with its planned operands (its
  // inputs are complete and not yet overwritten). Same restriction.
  using InputHook = std::function<absl::Status(int node, const LayerIo& io)>;
  void set_input_hook(InputHook hook) { input_hook_ = std::move(hook); }
  // Data parallelism: Backward hands every layer's gradients to `reducer` (null: none).
  void set_gradient_reducer(GradientReducer* reducer) { reducer_ = reducer; }
  // Data parallelism with synchronized batch norm: training passes of every batch-norm layer
  // exchange statistics through `sync` (null: none). Every rank's network must then run its
  // training passes together (trainer/dist).
  void set_batch_norm_sync(kernels::BatchNormSync* sync) {
    for (LayerIo& io : io_) io.batch_norm_sync = sync;
  }

 private:
  struct Value {
    void* data = nullptr;  // [batch, H, W, C] elements of dtype_, in arena_
    void* grad = nullptr;  // same size, in arena_; training networks only
    // Gradients from the second, third... consumer of a value; summed into grad before the
    // producer's backward (the role of Caffe's Split layer, without a layer).
    std::vector<void*> extra_grads;
    // The producer's backward adds extra_grads[0] itself as it reads grad (LayerIo::dy2):
    // no separate summing pass.
    bool producer_sums = false;
  };
  Network(Model* model, int batch, bool training);
  absl::Status Allocate(const PlanOptions& options);
  // bf16 networks: the fp32 input and the weight copies, cast for the forward pass; the
  // weight gradients, widened for the optimizer.
  absl::Status PlanBf16Casts();
  // Adds the zeros among the first `images` images of node j's input to the counts.
  absl::Status CountInputZeros(size_t j, int images);
  // The residual tails this network runs fused (PlanOptions::fuse_residual_tails), and per
  // node the index of the tail it belongs to (its add or a folded batch norm), or -1.
  std::vector<std::unique_ptr<ResidualTail>> tails_;
  std::vector<int> tail_of_;
  // Why the adds of this network run unfused where they do ("" when tails may fuse).
  std::string unfused_reason_;
  // Convolutions whose output one batch norm alone reads (PlanOptions::fuse_batch_norm_moments),
  // a summary per pair that the convolution may fill (LayerIo::moments), each pair's
  // convolution node, and per node its pair or -1. Sized once: the layers' io point into it.
  std::vector<kernels::BatchNormMoments> moments_;
  std::vector<int> moments_conv_;
  std::vector<int> moments_of_;
  // Whether node j is the convolution of such a pair (it may write the moments).
  bool WritesMoments(int j) const {
    return moments_of_[j] >= 0 && moments_conv_[moments_of_[j]] == j;
  }

  Model* model_;
  int batch_;
  bool training_;
  kernels::DType dtype_ = kernels::DType::kF32;
  std::vector<Value> values_;
  float* input_ = nullptr;   // values_[0], or input_f32_ in a bf16 network
  Buffer<float> input_f32_;  // bf16 networks: the batch as written, before the cast
  // bf16 networks: device tables of the weight casts (and, training, the gradient widenings).
  Buffer<kernels::CastItem> weight_casts_, grad_casts_;
  // Every activation and gradient, placed by lifetime (see Allocate).
  Buffer<char> arena_;
  std::vector<Buffer<float>> scratch_;               // per node
  std::vector<std::unique_ptr<LayerState>> states_;  // per node
  Buffer<float> workspace_;                          // shared by all nodes
  std::vector<LayerIo> io_;                          // per node, pointers fixed at plan time
  Buffer<int32_t> labels_;
  Buffer<float> sample_loss_;  // GPU: per-sample loss
  Buffer<int32_t> rank_;       // GPU: per-sample rank of the label
  Buffer<double> metrics_;     // GPU: running sums (loss, top-1, top-5, images)
  Metrics host_metrics_;       // CPU: running sums
  // Zeros counted per node (convolutions only; device counters on a GPU) and the elements
  // they were counted over; made at plan time.
  Buffer<unsigned long long> input_zeros_;
  std::vector<int64_t> input_zeros_host_, input_elements_;
  LayerHook hook_;
  InputHook input_hook_;
  GradientReducer* reducer_ = nullptr;
  size_t planned_bytes_ = 0;
  PlanProgress plan_progress_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_MODEL_H_
