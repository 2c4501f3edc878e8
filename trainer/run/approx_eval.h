// Evaluation of a trained checkpoint with multipliers, without training: the approximate-
// hardware designer's everyday job. A CheckpointEvaluator loads the checkpoint's data once
// and evaluates its weights under any assignment of multipliers to conv layers; Sensitivity
// measures each layer alone under each multiplier and picks, greedily, the assignment of
// least multiplier power within an accuracy-loss budget.
#ifndef TOPIARY_TRAINER_RUN_APPROX_EVAL_H_
#define TOPIARY_TRAINER_RUN_APPROX_EVAL_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/approx/code_use.h"
#include "trainer/approx/multiplier.h"
#include "trainer/run/runner.h"

namespace topiary {

struct ConvLayerInfo {
  std::string name;
  // Multiply-accumulates per image that its kept weights do: masked weights do none, and a
  // compacted layer is narrower (what the multiplier power of Sensitivity weighs).
  int64_t macs = 0;
};

// What Open may change about the checkpoint's own evaluation.
struct EvaluatorOptions {
  // Another device kind than the checkpoint's: the first device of that kind (a BF16 spec
  // evaluates in FP32 on the CPU).
  std::optional<topiary::v1::DeviceSpec::Kind> device;
  // Another data set (`--data`, topiary::ParseDataFlag's forms; an image folder is read at
  // the network's input size): what evaluates an imported network that records none.
  std::string data;
  int64_t test_limit = 0;  // only the first N test images (0: as the checkpoint's spec says)
};

class CheckpointEvaluator {
 public:
  // The checkpoint's own spec says which model, dataset and device; its approximation block
  // (if the model was trained approximate) is what Evaluate(nullopt) uses. `device`, when
  // given, replaces the spec's device kind (a GPU-trained checkpoint measured on the CPU: a
  // BF16 spec then evaluates in FP32, the CPU's precision).
  // An imported network (no model.arch: its graph is in the file) evaluates on the data set
  // recorded at import or given by options.data; without either, the error says so.
  static absl::StatusOr<std::unique_ptr<CheckpointEvaluator>> Open(const std::string& checkpoint,
                                                                   const EvaluatorOptions& options);
  static absl::StatusOr<std::unique_ptr<CheckpointEvaluator>> Open(
      const std::string& checkpoint,
      std::optional<topiary::v1::DeviceSpec::Kind> device = std::nullopt) {
    EvaluatorOptions options;
    options.device = device;
    return Open(checkpoint, options);
  }
  ~CheckpointEvaluator();

  const topiary::v1::ExperimentSpec& spec() const;
  const std::vector<ConvLayerInfo>& conv_layers() const;
  std::string device_name() const;

  // Test-set metrics of the checkpoint's weights with `approximation` (nullopt: the
  // checkpoint's own; an empty ApproximationSpec: every convolution exact). With `code_use`,
  // also each approximate layer's error at the codes it uses (trainer/approx/code_use.h), on
  // the test set's first batch, in model order.
  absl::StatusOr<EvalResult> Evaluate(
      const std::optional<topiary::v1::ApproximationSpec>& approximation,
      std::vector<CodeUse>* code_use = nullptr);

  // The deployment question for the checkpoint's model as trained (its precision, masks and
  // multipliers): per engine mode, cuDNN only (BlockSparseMode::kOff) and block-sparse where
  // it measures faster (kAuto), the test-set accuracy at batch `batch`, the throughput at that
  // batch and the latency of one image (captured forward passes, replayed for about a second),
  // the board's energy per image at `batch` (NVML; 0 without), and per convolution the time
  // of one image's forward pass (eager, the device synchronized after each layer: launch
  // costs included).
  struct Bench {
    std::string engine;  // "dense" (cuDNN, or the CPU kernels) | "dispatch"
    EvalResult accuracy;
    int batch = 0;
    double images_per_s = 0;
    double batch1_ms = 0;
    double joules_per_image = 0;
    int block_sparse_passes = 0;  // forward passes at `batch` that run block-sparse
    int64_t multiply_adds = 0;    // of one image, convolutions and linear layers
    int64_t parameters = 0;       // trainable
    std::vector<std::pair<std::string, double>> layer_ms;  // batch 1, conv layers
  };
  absl::StatusOr<std::vector<Bench>> BenchInference(int batch);

 private:
  struct State;
  explicit CheckpointEvaluator(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

struct SensitivityReport {
  double float_top1 = 0;  // every convolution exact (no quantization)
  std::vector<Multiplier> multipliers;
  // Per conv layer (model order): top-1 with only that layer approximate, per multiplier.
  struct Row {
    ConvLayerInfo layer;
    std::vector<double> top1;
    std::vector<CodeUse> code_use;  // per multiplier: its error at this layer's codes
  };
  std::vector<Row> rows;
  // The greedy assignment: layer -> multiplier index (layers left out stay exact).
  double budget_pts = 0;
  std::vector<std::pair<std::string, int>> assignment;
  double assigned_top1 = 0;
  // Power of the multipliers summed over every multiply-accumulate of one image, relative
  // to the exact multiplier's (1 = no saving); only multipliers of known power take part.
  double relative_power = 1;
  std::vector<std::string> unknown_power;  // multipliers the greedy step could not use
};

// `progress(done, total)` is called after every evaluation. The budget is in percentage
// points of test top-1 below float_top1. `base` gives the range mode and weight codes of
// every assignment (its rules are ignored): the checkpoint's own approximation, or another.
absl::StatusOr<SensitivityReport> Sensitivity(
    CheckpointEvaluator& evaluator, const std::vector<std::string>& multipliers, double budget_pts,
    const topiary::v1::ApproximationSpec& base,
    const std::function<void(int, int)>& progress = nullptr);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_APPROX_EVAL_H_
