// A spec's gradient_sampling block applied to a model (which conv layers sample their weight
// gradient, and how) and the policy that decides which training steps sample.
#ifndef TOPIARY_TRAINER_RUN_GRADIENT_SAMPLING_H_
#define TOPIARY_TRAINER_RUN_GRADIENT_SAMPLING_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/events.pb.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/model.h"

namespace topiary {

// The conv layers the block selects, in model order: those matching a `layers` glob (every
// conv when there is none) and no `exclude` glob; with every_other, of those the ones with a
// filter larger than 1x1, every other one. A glob that matches no conv layer, or a selection
// that is empty, is an INVALID_ARGUMENT error naming the field.
absl::StatusOr<std::vector<Conv2d*>> SelectSampledLayers(
    const topiary::v1::GradientSamplingSpec& spec, const Model& model);

// SelectSampledLayers, then Conv2d::SampleWeightGradients on each (before any network is
// planned). Returns the report of what was applied (layers, top_k, scale, policy; no steps).
absl::StatusOr<topiary::v1::GradientSamplingReport> ApplyGradientSampling(
    const topiary::v1::GradientSamplingSpec& spec, Model* model);

// Whether the following backward passes of every sampling conv layer of `model` sample.
void SetSampling(Model* model, bool on);

// Which steps sample: none during the warm-up epochs, then every step, every n-th step of an
// epoch, every other epoch, or each step with a probability (a stateless draw keyed by the
// seed and the global step, so a resumed run decides exactly as the uninterrupted one).
class SamplingPolicy {
 public:
  SamplingPolicy(const topiary::v1::GradientSamplingSpec& spec, uint64_t seed);
  // run_epoch: training epochs completed in the run (all phases) before this step's epoch;
  // step: the step's index within its epoch; global_step: optimizer steps before it.
  bool Samples(int run_epoch, int step, int64_t global_step) const;
  // e.g. "every step after 2 warm-up epochs", "probability 0.5".
  std::string Describe() const;

 private:
  topiary::v1::GradientSamplingSpec spec_;
  std::array<uint32_t, 2> key_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_GRADIENT_SAMPLING_H_
