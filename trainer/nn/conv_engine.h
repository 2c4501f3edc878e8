// How a Conv2d computes: the seam where the exact convolution (cuDNN, or the CPU kernels)
// and the approximate one (8x8-bit multiplier tables) plug in, and where sampled weight
// gradients and block-sparse kernels join them. An engine belongs to one layer; whatever
// depends on a planned batch size (plans, scratch) lives in that network's LayerResources.
#ifndef TOPIARY_TRAINER_NN_CONV_ENGINE_H_
#define TOPIARY_TRAINER_NN_CONV_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/approx/approx_conv.h"
#include "kernels/conv/conv.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/nn/layer.h"
#include "trainer/util/enum_pairs.h"

namespace topiary {

// How a layer samples its weight gradient (docs/algorithms.md §5): set by the runner from the
// spec's gradient_sampling block. Whether a given step samples is the runner's decision.
struct GradientSampling {
  enum class Scale {
    kUnbiased,  // the sampled sum keeps the exact gradient's magnitude
    kReference  // divided by the batch size, as the reference kernel did
  };
  int top_k = 1;
  Scale scale = Scale::kUnbiased;
};

// What an engine computes with, for one call: the layer (named in errors), its shape for the
// batch at hand, its kernel [K, R, S, C] and bias (null when it has none), and how its weight
// gradient may be sampled (null: always exact) and whether this step samples it.
struct ConvOperands {
  const std::string& layer;
  kernels::ConvShape shape;
  Parameter* kernel;
  Parameter* bias;
  const GradientSampling* sampling = nullptr;
  bool sample = false;
};

class ConvEngine {
 public:
  virtual ~ConvEngine() = default;
  virtual absl::StatusOr<LayerResources> Prepare(const ConvOperands& op, Device* device,
                                                 const PlanOptions& options) = 0;
  virtual absl::Status Forward(const ConvOperands& op, const LayerIo& io, bool training) = 0;
  virtual absl::Status Backward(const ConvOperands& op, const LayerIo& io) = 0;
};

// Every engine's backward pass computes the filter gradient exactly or, when the operands say
// so, sampled (kernels/conv/sampled_grad.h) at the same operands, masked entries left at zero; the
// input gradient is always exact.

// The exact convolution: cuDNN on a GPU (fp32, TF32 or bf16), the CPU kernels otherwise.
std::unique_ptr<ConvEngine> MakeExactConvEngine();

// How a layer is approximated (docs/algorithms.md §4). Made by the runner from the spec's
// approximation rules; the layer keeps it for checkpoints and reports.
struct ConvApproximation {
  enum class Range {
    kPerBatch,      // each batch's min and max (the reference)
    kMovingAverage  // a running range (the layer's activation_range parameter)
  };
  std::string multiplier;      // as the rule names it: a family ("trunc:4") or a .bin path
  std::string sha256;          // of the table's contents as loaded (before weight tuning)
  bool weight_tuning = false;  // ALWANN's weight-code remapping is folded into `table`
  Range range = Range::kPerBatch;
  std::vector<uint16_t> table;  // 65,536 entries, T[(a << 8) | w], as the kernels use it
  // How weights become codes; with WeightCode::kSignMagnitude `table` is
  // kernels::SignMagnitudeTable of the multiplier.
  kernels::ApproxWeights weights;
};

// The spec's enums and the engine's, either way: the spec (and the reports, which speak the
// spec's terms) at one end, the layers and kernels at the other; the checkpoint's names are
// trainer/store/checkpoint_schema.h's.
using SpecApprox = topiary::v1::ApproximationSpec;
using SpecSampling = topiary::v1::GradientSamplingSpec;
// One pair per value; the first pair is the default either way.
inline constexpr std::pair<SpecApprox::RangeMode, ConvApproximation::Range> kSpecRanges[] = {
    {SpecApprox::PER_BATCH, ConvApproximation::Range::kPerBatch},
    {SpecApprox::MOVING_AVERAGE, ConvApproximation::Range::kMovingAverage}};
inline constexpr std::pair<SpecApprox::WeightCode, kernels::WeightCode> kSpecWeightCodes[] = {
    {SpecApprox::ASYMMETRIC, kernels::WeightCode::kAsymmetric},
    {SpecApprox::SIGN_MAGNITUDE, kernels::WeightCode::kSignMagnitude}};
inline constexpr std::pair<SpecSampling::Scale, GradientSampling::Scale> kSpecScales[] = {
    {SpecSampling::UNBIASED, GradientSampling::Scale::kUnbiased},
    {SpecSampling::REFERENCE, GradientSampling::Scale::kReference}};
template <typename Spec, typename Engine, size_t N>
Engine FromSpec(const std::pair<Spec, Engine> (&pairs)[N], Spec value) {
  return SecondOf(pairs, value).value_or(pairs[0].second);
}
template <typename Spec, typename Engine, size_t N>
Spec ToSpec(const std::pair<Spec, Engine> (&pairs)[N], Engine value) {
  return FirstOf(pairs, value).value_or(pairs[0].first);
}

// The approximate convolution: a table convolution forward, and a straight-through backward
// pass (the exact convolution's gradients at the fake-quantized operands). `range` is the
// layer's activation_range parameter [min, max, observed] with the moving-average mode,
// null with the per-batch one. The table is copied to `device`. fp32 networks only.
absl::StatusOr<std::unique_ptr<ConvEngine>> MakeApproxConvEngine(const ConvApproximation& approx,
                                                                 Parameter* range, Device* device);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_CONV_ENGINE_H_
