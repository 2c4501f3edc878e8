#include "trainer/run/gradient_sampling.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/core/random.h"
#include "trainer/util/glob.h"
#include "util/status_macros.h"

namespace topiary {

using topiary::v1::GradientSamplingSpec;

namespace {

// Whether any glob matches `name`, marking the ones that do.
bool AnyMatch(const google::protobuf::RepeatedPtrField<std::string>& globs, const std::string& name,
              std::vector<bool>* used) {
  bool any = false;
  for (int i = 0; i < globs.size(); ++i) {
    if (GlobMatch(globs[i], name)) any = (*used)[i] = true;
  }
  return any;
}

absl::Status CheckAllUsed(const google::protobuf::RepeatedPtrField<std::string>& globs,
                          const std::vector<bool>& used, const std::string& field,
                          const Model& model) {
  for (int i = 0; i < globs.size(); ++i) {
    if (!used[i]) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: '", globs[i],
                                                     "' matches no convolution of ", model.arch()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Conv2d*>> SelectSampledLayers(const GradientSamplingSpec& spec,
                                                         const Model& model) {
  std::vector<bool> used_layers(spec.layers_size()), used_exclude(spec.exclude_size());
  std::vector<Conv2d*> out;
  for (const Model::Node& node : model.nodes()) {
    if (node.layer->kind() != LayerKind::kConv2d) continue;
    const std::string& name = node.layer->name();
    const bool listed = spec.layers().empty() || AnyMatch(spec.layers(), name, &used_layers);
    const bool excluded = AnyMatch(spec.exclude(), name, &used_exclude);
    if (listed && !excluded) out.push_back(static_cast<Conv2d*>(node.layer));
  }
  if (auto st = CheckAllUsed(spec.layers(), used_layers, "gradient_sampling.layers", model);
      !st.ok()) {
    return st;
  }
  if (auto st = CheckAllUsed(spec.exclude(), used_exclude, "gradient_sampling.exclude", model);
      !st.ok()) {
    return st;
  }
  if (spec.every_other()) {
    std::vector<Conv2d*> larger;
    for (Conv2d* c : out) {
      const kernels::ConvShape s = c->ShapeFor(1);
      if (s.r * s.s > 1) larger.push_back(c);
    }
    out.clear();
    for (size_t i = 0; i < larger.size(); i += 2) out.push_back(larger[i]);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient_sampling: selects no convolution of ", model.arch()));
  }
  return out;
}

absl::StatusOr<topiary::v1::GradientSamplingReport> ApplyGradientSampling(
    const GradientSamplingSpec& spec, Model* model) {
  TOPIARY_ASSIGN_OR_RETURN(auto layers, SelectSampledLayers(spec, *model));
  const GradientSampling sampling{spec.top_k() > 0 ? spec.top_k() : 1,
                                  FromSpec(kSpecScales, spec.scale())};
  topiary::v1::GradientSamplingReport report;
  for (Conv2d* conv : layers) {
    if (auto st = conv->SampleWeightGradients(sampling); !st.ok()) return st;
    report.add_layers(conv->name());
  }
  report.set_top_k(sampling.top_k);
  report.set_scale(ToSpec(kSpecScales, sampling.scale));
  report.set_policy(SamplingPolicy(spec, 0).Describe());
  return report;
}

void SetSampling(Model* model, bool on) {
  for (const Model::Node& node : model->nodes()) {
    if (node.layer->kind() == LayerKind::kConv2d) static_cast<Conv2d*>(node.layer)->SetSampling(on);
  }
}

SamplingPolicy::SamplingPolicy(const GradientSamplingSpec& spec, uint64_t seed)
    : spec_(spec), key_(Philox(seed, RngStream::kGradientSampling).key()) {}

bool SamplingPolicy::Samples(int run_epoch, int step, int64_t global_step) const {
  if (run_epoch < spec_.warmup_epochs()) return false;
  switch (spec_.steps_case()) {
    case GradientSamplingSpec::kProbability: {
      const uint64_t g = static_cast<uint64_t>(global_step);
      const uint32_t word =
          Philox4x32({static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32), 0, 0}, key_)[0];
      return (word >> 8) * (1.0 / (1 << 24)) < spec_.probability();
    }
    case GradientSamplingSpec::kEveryNSteps:
      return step % spec_.every_n_steps() == 0;
    case GradientSamplingSpec::kAlternateEpochs:
      return (run_epoch - spec_.warmup_epochs()) % 2 == 0;
    case GradientSamplingSpec::STEPS_NOT_SET:
      break;
  }
  return true;
}

std::string SamplingPolicy::Describe() const {
  std::string when;
  switch (spec_.steps_case()) {
    case GradientSamplingSpec::kProbability:
      when = absl::StrFormat("probability %g", spec_.probability());
      break;
    case GradientSamplingSpec::kEveryNSteps:
      when = spec_.every_n_steps() == 1 ? "every step"
                                        : absl::StrFormat("every %d steps", spec_.every_n_steps());
      break;
    case GradientSamplingSpec::kAlternateEpochs:
      when = "alternate epochs";
      break;
    case GradientSamplingSpec::STEPS_NOT_SET:
      when = "every step";
  }
  if (spec_.warmup_epochs() > 0) {
    absl::StrAppendFormat(&when, " after %d warm-up epoch%s", spec_.warmup_epochs(),
                          spec_.warmup_epochs() == 1 ? "" : "s");
  }
  return when;
}

}  // namespace topiary
