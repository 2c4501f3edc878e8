// Layer: forward and backward of one operation, written by hand (no general autograd).
//
// A layer holds its configuration and parameters only; everything that depends on the batch
// (activations, gradients, saved statistics, workspaces) belongs to the Network that plans
// it, so one set of layers serves a training network and an evaluation network with
// different batch sizes. Conv2d is the extension point for other forward and weight-gradient
// modes (approximate, block-sparse, sampled).
#ifndef TOPIARY_TRAINER_NN_LAYER_H_
#define TOPIARY_TRAINER_NN_LAYER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/norm_pool/residual_tail.h"
#include "kernels/runtime/dtype.h"
#include "topiary/v1/network.pb.h"
#include "trainer/core/device.h"
#include "trainer/core/parameter.h"
#include "trainer/core/random.h"

namespace topiary {

// Shape of an activation: NHWC. Vectors (after Flatten, Linear) are [N, 1, 1, C].
struct Shape4 {
  int n = 0, h = 0, w = 0, c = 0;
  size_t count() const { return static_cast<size_t>(n) * h * w * c; }
  size_t per_image() const { return static_cast<size_t>(h) * w * c; }
  bool operator==(const Shape4& o) const { return n == o.n && h == o.h && w == o.w && c == o.c; }
};

// How a block-masked convolution's passes run on a GPU (trainer/nn/sparse_dispatch.h): per
// pass (forward, backward data, backward filter) whether the block-sparse kernels or cuDNN's
// dense plan runs it, with both measured times (ms, -1: not measured yet).
struct SparseConvChoice {
  double density = 1;  // kept blocks / all blocks when measured
  bool sparse[3] = {false, false, false};
  float dense_ms[3] = {-1, -1, -1};
  float sparse_ms[3] = {-1, -1, -1};
  std::string config[3];  // the sparse kernel configuration measured, e.g. "tc 128x64/4"
  // The forward timed with the batch norm's statistics on both sides, against the moments
  // route (moments_dispatch.h) rather than cuDNN alone.
  bool forward_with_statistics = false;
};

// Per-network state of a layer beyond its buffers (e.g. a convolution's cuDNN plan).
class LayerState {
 public:
  virtual ~LayerState() = default;
  // A block-masked convolution's measured engine choice; null for every other layer.
  virtual const SparseConvChoice* sparse_choice() const { return nullptr; }
  // What runs the layer's passes, for the plan report (Network::PlanReport); empty when
  // there is no choice to tell of.
  virtual std::string Describe() const { return ""; }
};

// Whether block-masked convolutions may run on block-sparse kernels (GPU): where they measure
// faster (auto), always (on), never (off). TOPIARY_SPARSE_CONV=on|off overrides it.
enum class BlockSparseMode { kAuto, kOn, kOff };

// How a network's planning went, so far: layers planned, and how each convolution's
// algorithms were chosen (trainer/nn/plan_cache.h).
struct PlanProgress {
  int layers_done = 0, layers_total = 0;
  int convs_cached = 0;    // made from the plan cache (on disk, or planned before in-process)
  int convs_measured = 0;  // searched and timed now
  int convs_untimed = 0;   // the heuristics' first choice: deterministic, or the budget spent
  double seconds = 0;
};

// How a network is planned.
struct PlanOptions {
  // fp32, tf32 (convolutions may use TF32 tensor cores) or bf16 (bf16 activations and weight
  // copies, GPU only); see kernels/runtime/dtype.h.
  kernels::Precision precision = kernels::Precision::kFp32;
  size_t conv_workspace_limit = 1ull << 30;  // bytes a cuDNN algorithm may use
  bool deterministic = false;                // only algorithms that give the same bits on every run
  BlockSparseMode block_sparse = BlockSparseMode::kAuto;
  // Synchronized batch norm (device.sync_batch_norm): the ranks whose moments a GPU batch norm
  // gathers, for its workspace (1: not synchronized).
  int batch_norm_ranks = 1;
  // GPU networks run each residual block's last batch norm(s), add and ReLU as one pass each
  // way (trainer/nn/residual_tail.h). Off: every layer on its own (the reference path).
  bool fuse_residual_tails = true;
  // bf16 GPU training networks: a convolution whose output one batch norm alone reads may
  // write that batch norm's statistics from its epilogue, where measured faster
  // (trainer/nn/moments_dispatch.h). Off: the batch norm always reads its input for them.
  bool fuse_batch_norm_moments = true;
  // Set by Network::Plan for the Prepare call of such a convolution (of a pair it fuses).
  bool moments_for_batch_norm = false;
  // Seconds Network::Plan may spend timing convolution algorithms that the plan cache does not
  // know; once spent, the rest take cuDNN's heuristic choice untimed (and are timed by a later
  // plan, which finds them marked so in the cache).
  double search_seconds = 15;
  // Seconds a plan may spend timing convolutions the cache knows only untimed, so each start
  // refines a few of them and a start with a warm cache stays fast.
  double refine_seconds = 2;
  // Called after each layer is planned (on the planning thread).
  std::function<void(const PlanProgress&)> progress;

  // Set by Network::Plan for its layers: when the search budget ends, and where the layers
  // count their convolutions.
  std::chrono::steady_clock::time_point search_deadline =
      std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point refine_deadline =
      std::chrono::steady_clock::time_point::max();
  PlanProgress* stats = nullptr;
};

// What a layer needs in a network planned for a batch size.
struct LayerResources {
  size_t scratch_floats = 0;   // kept from forward to backward
  size_t workspace_bytes = 0;  // free between calls (one workspace serves every layer)
  std::unique_ptr<LayerState> state;
};

// Pointers a layer reads and writes in one pass, all sized for `batch` images, on the
// network's device. Activations and their gradients are of type `dtype` (fp32, or bf16 in a
// bf16 network on a GPU); scratch is fp32.
struct LayerIo {
  int batch = 0;
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<const void*> x;  // inputs
  void* y = nullptr;           // output
  std::vector<void*> dx;       // input gradients (overwritten); null where none is needed
  const void* dy = nullptr;    // output gradient
  // A second output gradient to add to dy (the other reader of a value read by two layers),
  // set only for layers whose sums_output_gradients() is true; null otherwise.
  const void* dy2 = nullptr;
  float* scratch = nullptr;     // LayerResources::scratch_floats, kept forward to backward
  void* workspace = nullptr;    // LayerResources::workspace_bytes, free between calls
  LayerState* state = nullptr;  // LayerResources::state
  const kernels::CudaContext* cuda = nullptr;  // the stream and handles; null on the CPU
  // Data parallelism with device.sync_batch_norm: the ranks' statistics exchange (batch norm
  // layers only; null: each rank normalizes over its own share).
  kernels::BatchNormSync* batch_norm_sync = nullptr;
  // A convolution and the batch norm that alone reads its output, in a training network's
  // forward pass (PlanOptions::fuse_batch_norm_moments): the convolution may write the batch
  // norm's moments of its output here (slices > 0: it did; the network resets it to 0 before
  // the convolution runs), and the batch norm then merges them instead of reading its input
  // for its statistics. Null for every other layer.
  kernels::BatchNormMoments* moments = nullptr;

  // fp32 views for the CPU kernels (CPU networks are always fp32).
  const float* xf(size_t i) const { return static_cast<const float*>(x[i]); }
  float* yf() const { return static_cast<float*>(y); }
  float* dxf(size_t i) const { return static_cast<float*>(dx[i]); }
  const float* dyf() const { return static_cast<const float*>(dy); }
};

// What the kernels of a network of element type `t` read and write for a weight: the fp32
// master, or the bf16 copy (see Parameter::value_bf16).
const void* WeightFor(const Parameter& p, kernels::DType t);
void* WeightGradFor(const Parameter& p, kernels::DType t);
// Gives p its bf16 copies (once; later calls do nothing).
absl::Status AddBf16Copies(Parameter* p, Device* device);

// What a layer computes. An enum, not a string, so that code which must treat every
// convolution (pruning, approximation, reports) cannot miss one by a typo.
enum class LayerKind {
  kConv2d,
  kBatchNorm,
  kLinear,
  kMaxPool,
  kAvgPool,
  kGlobalAvgPool,
  kRelu,
  kAdd,
  kFlatten,
  kGroupedConv2d,
  kRelu6,
  kConcat,
  kSigmoid,
  kSilu,
  kLeakyRelu,
  kHardSigmoid,
  kHardSwish,
  kMul
};
// The network graph's kind (topiary/v1/network.proto LayerNode.Kind) of each LayerKind, and
// back (nullopt: NODE_KIND_UNSPECIFIED or a value this build does not know).
topiary::v1::NodeKind NodeKindOf(LayerKind kind);
std::optional<LayerKind> LayerKindOf(topiary::v1::NodeKind kind);
// "conv2d", "batch_norm", "linear", "max_pool", ... (for reports and benchmarks): the graph
// kind's name.
const std::string& LayerKindName(LayerKind kind);

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  virtual LayerKind kind() const = 0;
  const char* type() const { return LayerKindName(kind()).c_str(); }

  // Called once, when the layer joins a model: checks the input shapes (n = 1), creates the
  // parameters on `device` and returns the output shape for one image. Errors name the layer.
  virtual absl::StatusOr<Shape4> Setup(const std::vector<Shape4>& inputs, Device* device) = 0;
  // Fills the parameters with their initial values.
  virtual void Initialize(Philox& rng) {}
  // What the layer is, as a node of a network graph (trainer/nn/graph.h): name and kind here,
  // each layer its own attributes; the inputs are the graph's business.
  virtual void Describe(topiary::v1::LayerNode* node) const {
    node->set_name(name_);
    node->set_kind(NodeKindOf(kind()));
  }

  // Called once per planned network: what the layer needs for `batch` images on `device`.
  virtual absl::StatusOr<LayerResources> Prepare(int batch, Device* device,
                                                 const PlanOptions& options) {
    return LayerResources{};
  }

  // training: batch statistics in batch norm (and whatever else differs from inference).
  // On a GPU the work is enqueued on io.cuda->stream; errors are launch errors.
  virtual absl::Status Forward(const LayerIo& io, bool training) = 0;
  // REQUIRES: the Forward of the same batch ran with training = true.
  virtual absl::Status Backward(const LayerIo& io) = 0;

  // Which values of the forward pass Backward reads (besides dy) on a GPU or the CPU: a
  // network reuses the memory of a value no backward pass reads once the forward pass is
  // past its last reader. The default, everything, is always safe.
  struct BackwardReads {
    bool inputs = true;
    bool output = true;
  };
  virtual BackwardReads backward_reads(bool gpu) const { return {}; }
  // Whether Backward can add a second output gradient (LayerIo::dy2) as it reads dy, so that
  // a value read by two layers needs no separate summing pass. Only when every input needs
  // a gradient.
  virtual bool sums_output_gradients() const { return false; }

  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> out;
    for (auto& p : params_) out.push_back(p.get());
    return out;
  }
  // The parameter with `role` (kernel, gamma, ...), or null when the layer has none.
  Parameter* parameter(ParamRole role) const {
    for (const auto& p : params_) {
      if (p->role == role) return p.get();
    }
    return nullptr;
  }

 protected:
  // Creates a parameter (with gradient and momentum when trainable).
  absl::StatusOr<Parameter*> AddParameter(Device* device, ParamRole role, std::vector<int> shape,
                                          bool trainable, bool decay);

 private:
  std::string name_;
  std::vector<std::unique_ptr<Parameter>> params_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_LAYER_H_
