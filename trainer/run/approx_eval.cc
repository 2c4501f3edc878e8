#include "trainer/run/approx_eval.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "trainer/approx/approximation.h"
#include "trainer/data/dataset.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/spec/spec.h"
#include "trainer/store/checkpoint.h"

namespace topiary {

using topiary::v1::ApproximationSpec;

struct CheckpointEvaluator::State {
  std::string path;
  topiary::v1::ExperimentSpec spec;
  std::unique_ptr<Device> device;
  Dataset data;
  std::optional<Batcher> batcher;
  std::optional<DeviceBatches> batches;
  std::vector<ConvLayerInfo> convs;

  // A fresh model of the checkpoint's architecture (parameters not loaded).
  absl::StatusOr<std::unique_ptr<Model>> BuildModel() const {
    return topiary::BuildModel(spec.model().arch(), spec.model().width(),
                               {1, data.test.h, data.test.w, data.test.c}, data.classes,
                               device.get());
  }
};

CheckpointEvaluator::CheckpointEvaluator(std::unique_ptr<State> state) : state_(std::move(state)) {}
CheckpointEvaluator::~CheckpointEvaluator() = default;

const topiary::v1::ExperimentSpec& CheckpointEvaluator::spec() const { return state_->spec; }
const std::vector<ConvLayerInfo>& CheckpointEvaluator::conv_layers() const { return state_->convs; }
std::string CheckpointEvaluator::device_name() const { return state_->device->name(); }

absl::StatusOr<std::unique_ptr<CheckpointEvaluator>> CheckpointEvaluator::Open(
    const std::string& checkpoint) {
  auto doc = ReadCheckpointFile(checkpoint);
  if (!doc.ok()) return doc.status();
  const CheckpointState cs = CheckpointStateOf(*doc);
  auto spec = ParseSpec(cs.spec_text, checkpoint + " (its spec)");
  if (!spec.ok()) return spec.status();
  if (auto st = ValidateSpec(*spec); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint, ": its spec: ", st.message()));
  }
  auto s = std::make_unique<State>();
  s->path = checkpoint;
  s->spec = WithDefaults(*spec);
  auto device = CreateDevice(s->spec.device());
  if (!device.ok()) return device.status();
  s->device = std::move(*device);
  auto data = LoadDataset(s->spec.data(), s->spec.seed());
  if (!data.ok()) return data.status();
  s->data = std::move(*data);
  if (s->data.test.size() == 0) return absl::InvalidArgumentError("data: the test set is empty");
  const auto norm =
      ComputeNormalization(s->data.train, s->data.max_value, s->spec.data().normalize());
  s->batcher.emplace(&s->data.test, s->data.max_value, norm, topiary::v1::Augment{},
                     s->spec.seed());
  auto batches = DeviceBatches::Create(&*s->batcher, s->device.get());
  if (!batches.ok()) return batches.status();
  s->batches.emplace(std::move(*batches));
  TOPIARY_RETURN_IF_ERROR(s->batches->SetSequentialOrder());
  // The conv layers and their work, from a model of the checkpoint's architecture.
  auto model = s->BuildModel();
  if (!model.ok()) return model.status();
  for (const Model::Node& node : (*model)->nodes()) {
    if (node.layer->kind() != LayerKind::kConv2d) continue;
    const kernels::ConvShape sh = static_cast<const Conv2d*>(node.layer)->ShapeFor(1);
    s->convs.push_back(
        {node.layer->name(), static_cast<int64_t>(sh.ho()) * sh.wo() * sh.k * sh.patch()});
  }
  return std::unique_ptr<CheckpointEvaluator>(new CheckpointEvaluator(std::move(s)));
}

absl::StatusOr<EvalResult> CheckpointEvaluator::Evaluate(
    const std::optional<ApproximationSpec>& approximation) {
  const State& s = *state_;
  const ApproximationSpec& approx = approximation ? *approximation : s.spec.approximation();
  auto model = s.BuildModel();
  if (!model.ok()) return model.status();
  // Before the load: a moving-average range is a parameter the checkpoint may hold.
  if (approx.rules_size() > 0) TOPIARY_RETURN_IF_ERROR(ApplyApproximation(approx, model->get()));
  auto loaded = LoadCheckpoint(s.path, model->get(), /*with_optimizer=*/false);
  if (!loaded.ok()) return loaded.status();
  // fp32 (or TF32 where the spec asks), whatever the training precision: approximate
  // convolutions read fp32 activations, and every assignment is compared on one footing.
  PlanOptions options;
  options.precision = s.spec.train().precision() == topiary::v1::TrainSpec::TF32
                          ? kernels::Precision::kTf32
                          : kernels::Precision::kFp32;
  options.deterministic = s.spec.device().deterministic();
  auto net = Network::Plan(model->get(), s.spec.data().eval_batch_size(), false, options);
  if (!net.ok()) return net.status();
  return topiary::Evaluate(**net, *s.batches, static_cast<int64_t>(s.data.test.size()));
}

absl::StatusOr<SensitivityReport> Sensitivity(CheckpointEvaluator& evaluator,
                                              const std::vector<std::string>& multipliers,
                                              double budget_pts,
                                              const std::function<void(int, int)>& progress) {
  SensitivityReport report;
  report.budget_pts = budget_pts;
  for (size_t i = 0; i < multipliers.size(); ++i) {
    auto m = LoadMultiplier(multipliers[i]);
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          absl::StrCat("multiplier ", i + 1, ": ", m.status().message()));
    }
    report.multipliers.push_back(std::move(*m));
  }
  const ApproximationSpec& base = evaluator.spec().approximation();
  const auto& convs = evaluator.conv_layers();
  const int per_layer = static_cast<int>(convs.size() * multipliers.size());
  int done = 0, total = 1 + per_layer;
  auto step = [&] {
    ++done;
    if (progress) progress(done, total);
  };
  auto top1 = [&](const std::vector<std::pair<std::string, std::string>>& layers)
      -> absl::StatusOr<double> {
    auto r = evaluator.Evaluate(AssignmentRules(base, layers));
    if (!r.ok()) return r.status();
    step();
    return 100.0 * r->top1;
  };

  auto f = top1({});
  if (!f.ok()) return f.status();
  report.float_top1 = *f;
  for (const ConvLayerInfo& layer : convs) {
    SensitivityReport::Row row{layer, {}};
    for (const std::string& m : multipliers) {
      auto t = top1({{layer.name, m}});
      if (!t.ok()) return t.status();
      row.top1.push_back(*t);
    }
    report.rows.push_back(std::move(row));
  }

  // Greedy: the candidates (layer, multiplier) that save power, cheapest accuracy per unit of
  // saved power first; each is kept when the whole assignment, measured, stays in budget.
  auto exact = LoadMultiplier("exact");
  if (!exact.ok() || !exact->known) return absl::InternalError("the exact multiplier's power");
  const double p_exact = exact->known->power_mw;
  struct Candidate {
    size_t row;
    int multiplier;
    double saving, drop;
  };
  std::vector<Candidate> candidates;
  for (size_t j = 0; j < report.multipliers.size(); ++j) {
    const Multiplier& m = report.multipliers[j];
    if (!m.known) {
      report.unknown_power.push_back(m.name);
      continue;
    }
    for (size_t i = 0; i < report.rows.size(); ++i) {
      const double saving = report.rows[i].layer.macs * (p_exact - m.known->power_mw);
      const double drop = std::max(0.0, report.float_top1 - report.rows[i].top1[j]);
      if (saving > 0) candidates.push_back({i, static_cast<int>(j), saving, drop});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     return a.drop * b.saving < b.drop * a.saving ||
                            (a.drop * b.saving == b.drop * a.saving && a.saving > b.saving);
                   });
  std::vector<int> chosen(report.rows.size(), -1);
  std::vector<double> saved(report.rows.size(), 0.0);
  total = done + static_cast<int>(candidates.size());
  report.assigned_top1 = report.float_top1;
  for (const Candidate& c : candidates) {
    if (c.saving <= saved[c.row]) {
      step();
      continue;
    }
    const int before = chosen[c.row];
    chosen[c.row] = c.multiplier;
    std::vector<std::pair<std::string, std::string>> layers;
    for (size_t i = 0; i < chosen.size(); ++i) {
      if (chosen[i] >= 0) layers.emplace_back(report.rows[i].layer.name, multipliers[chosen[i]]);
    }
    auto t = top1(layers);
    if (!t.ok()) return t.status();
    if (report.float_top1 - *t <= budget_pts) {
      saved[c.row] = c.saving;
      report.assigned_top1 = *t;
    } else {
      chosen[c.row] = before;
    }
  }
  double power = 0, power_exact = 0;
  for (size_t i = 0; i < chosen.size(); ++i) {
    const double macs = static_cast<double>(report.rows[i].layer.macs);
    power_exact += macs * p_exact;
    if (chosen[i] < 0) {
      power += macs * p_exact;
    } else {
      power += macs * report.multipliers[chosen[i]].known->power_mw;
      report.assignment.emplace_back(report.rows[i].layer.name, chosen[i]);
    }
  }
  report.relative_power = power_exact > 0 ? power / power_exact : 1;
  return report;
}

}  // namespace topiary
