#include "trainer/run/approx_eval.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "trainer/approx/approximation.h"
#include "trainer/core/energy.h"
#include "trainer/data/dataset.h"
#include "trainer/nn/channels.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/run/evaluate.h"
#include "trainer/run/step_runner.h"
#include "trainer/spec/spec.h"
#include "trainer/store/checkpoint.h"
#include "trainer/store/inference.h"
#include "util/status_macros.h"

namespace topiary {

using topiary::v1::ApproximationSpec;

struct CheckpointEvaluator::State {
  InferenceCheckpoint checkpoint;
  const topiary::v1::ExperimentSpec& spec = checkpoint.spec;
  std::unique_ptr<Device> device;
  Dataset data;
  std::optional<Batcher> batcher;
  mutable std::optional<DeviceBatches> batches;  // mutable: a streamed set prefetches
  std::vector<ConvLayerInfo> convs;

  // The checkpoint's model for the test images: fresh, or with `approx` applied and its
  // weights (and masks) loaded.
  absl::StatusOr<std::unique_ptr<Model>> MakeModel(
      bool load, const ApproximationSpec* approx = nullptr) const {
    return InferenceModel(checkpoint, {1, data.test.batch_h(), data.test.batch_w(), data.test.c},
                          data.classes, device.get(), load, approx);
  }
};

CheckpointEvaluator::CheckpointEvaluator(std::unique_ptr<State> state) : state_(std::move(state)) {}
CheckpointEvaluator::~CheckpointEvaluator() = default;

const topiary::v1::ExperimentSpec& CheckpointEvaluator::spec() const { return state_->spec; }
const std::vector<ConvLayerInfo>& CheckpointEvaluator::conv_layers() const { return state_->convs; }
std::string CheckpointEvaluator::device_name() const { return state_->device->name(); }

absl::StatusOr<std::unique_ptr<CheckpointEvaluator>> CheckpointEvaluator::Open(
    const std::string& checkpoint, const EvaluatorOptions& options) {
  if (options.test_limit < 0) return absl::InvalidArgumentError("--test_limit: must be > 0");
  auto s = std::make_unique<State>();
  TOPIARY_ASSIGN_OR_RETURN(s->checkpoint, OpenForInference(checkpoint));
  topiary::v1::ExperimentSpec& spec = s->checkpoint.spec;
  const std::optional<topiary::v1::InputFormat>& input = s->checkpoint.file.state.input;
  // An imported network: its graph and input format are in the file, its data set in the
  // spec import recorded (if any).
  const bool imported = spec.model().arch().empty();
  if (!options.data.empty()) {
    TOPIARY_ASSIGN_OR_RETURN(
        *spec.mutable_data(),
        ParseDataFlag(options.data, input ? input->height() : 32, input ? input->channels() : 3));
    spec = WithDefaults(spec);  // the new block's batch sizes and the like
  } else if (imported && s->checkpoint.file.state.spec_text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(checkpoint,
                     ": an imported network that records no data set; name one with --data "
                     "(e.g. --data folder:PATH, --data fashion_mnist), or give it at import"));
  }
  if (imported && input) {
    // The network normalizes as recorded: the training images are not needed.
    spec.mutable_data()->set_train_limit(1);
  }
  if (options.test_limit > 0) spec.mutable_data()->set_test_limit(options.test_limit);
  if (options.device) {
    // Another device than the checkpoint's: the first one of that kind (a GPU ordinal the
    // checkpoint names may not exist here).
    spec.mutable_device()->set_kind(*options.device);
    spec.mutable_device()->clear_gpus();
    spec.mutable_device()->clear_gpu_count();
    if (*options.device == topiary::v1::DeviceSpec::CPU &&
        spec.train().precision() == topiary::v1::TrainSpec::BF16) {
      spec.mutable_train()->set_precision(topiary::v1::TrainSpec::FP32);
    }
  }
  // An imported network's spec names no model: it is the file's own (as for a run that
  // starts from it).
  topiary::v1::ExperimentSpec checked = spec;
  if (imported) checked.set_init_from_checkpoint(checkpoint);
  if (auto st = ValidateSpec(checked); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint, ": its spec: ", st.message()));
  }
  const CheckpointState& cs = s->checkpoint.file.state;
  TOPIARY_ASSIGN_OR_RETURN(auto device, CreateDevice(s->spec.device()));
  s->device = std::move(device);
  TOPIARY_ASSIGN_OR_RETURN(auto data, LoadDataset(s->spec.data(), s->spec.seed()));
  s->data = std::move(data);
  if (s->data.test.size() == 0) return absl::InvalidArgumentError("data: the test set is empty");
  // A network from a checkpoint's graph (no model.arch) reads what its checkpoint recorded.
  TOPIARY_ASSIGN_OR_RETURN(
      const Normalization norm,
      RunNormalization(s->data.train, s->data.max_value, s->spec.data().normalize(),
                       s->spec.model().arch().empty() && cs.input ? &*cs.input : nullptr));
  s->batcher.emplace(&s->data.test, s->data.max_value, norm, topiary::v1::Augment{},
                     s->spec.seed());
  TOPIARY_ASSIGN_OR_RETURN(auto batches, DeviceBatches::Create(&*s->batcher, s->device.get()));
  s->batches.emplace(std::move(batches));
  TOPIARY_RETURN_IF_ERROR(s->batches->SetSequentialOrder());
  // The conv layers and their work: the checkpoint's network (a compacted one is narrower)
  // with its masks, each kept weight doing one multiply-accumulate per output position.
  TOPIARY_ASSIGN_OR_RETURN(auto model, s->MakeModel(/*load=*/true));
  for (const Model::Node& node : model->nodes()) {
    if (node.layer->kind() != LayerKind::kConv2d) continue;
    const kernels::ConvShape sh = static_cast<const Conv2d*>(node.layer)->ShapeFor(1);
    const Parameter& kernel = *node.layer->parameter(ParamRole::kKernel);
    const int64_t kept = static_cast<int64_t>(kernel.size()) - MaskedCount(kernel);
    s->convs.push_back({node.layer->name(), static_cast<int64_t>(sh.ho()) * sh.wo() * kept});
  }
  return std::unique_ptr<CheckpointEvaluator>(new CheckpointEvaluator(std::move(s)));
}

namespace {

// Each approximate layer's CodeUse on the first `images` (at most a batch) of `batches`: one
// more eager forward pass, whose input hook copies each approximate layer's input to the host.
absl::StatusOr<std::vector<CodeUse>> MeasureCodeUses(Network& net, const Model& model,
                                                     const ApproximationSpec& approx,
                                                     DeviceBatches& batches, int64_t images) {
  TOPIARY_ASSIGN_OR_RETURN(auto multipliers, LoadRuleMultipliers(approx));
  TOPIARY_ASSIGN_OR_RETURN(auto layers, MatchApproximationRules(approx, model));
  const std::map<std::string, int> rule_of(layers.begin(), layers.end());
  const int count = static_cast<int>(std::min<int64_t>(net.batch(), images));
  TOPIARY_RETURN_IF_ERROR(batches.Assemble(nullptr, 0, 0, count, false, net.input(), net.labels()));
  Device* device = model.device();
  std::vector<CodeUse> out;
  net.set_input_hook([&](int node, const LayerIo& io) -> absl::Status {
    const Layer* layer = model.nodes()[node].layer;
    const auto rule = rule_of.find(layer->name());
    if (layer->kind() != LayerKind::kConv2d || rule == rule_of.end()) return absl::OkStatus();
    const auto* conv = static_cast<const Conv2d*>(layer);
    const kernels::ConvShape s = conv->ShapeFor(count);
    std::vector<float> x(static_cast<size_t>(s.n) * s.h * s.w * s.c);
    TOPIARY_RETURN_IF_ERROR(device->Synchronize());
    device->CopyToHost(x.data(), io.x[0], x.size() * sizeof(float));
    const std::vector<float> w = conv->kernel()->value.ToHost();
    const Parameter* running = layer->parameter(ParamRole::kActivationRange);
    const std::vector<float> range = running ? running->value.ToHost() : std::vector<float>{};
    out.push_back(MeasureCodeUse(layer->name(), s, x.data(), w.data(), *conv->approximation(),
                                 multipliers[rule->second]->table,
                                 range.size() == 3 ? range.data() : nullptr));
    return absl::OkStatus();
  });
  const absl::Status st = net.Forward(false);
  net.set_input_hook(nullptr);
  TOPIARY_RETURN_IF_ERROR(st);
  return out;
}

}  // namespace

absl::StatusOr<EvalResult> CheckpointEvaluator::Evaluate(
    const std::optional<ApproximationSpec>& approximation, std::vector<CodeUse>* code_use) {
  const State& s = *state_;
  const ApproximationSpec& approx = approximation ? *approximation : s.spec.approximation();
  TOPIARY_ASSIGN_OR_RETURN(auto model, s.MakeModel(/*load=*/true, &approx));
  // fp32 (or TF32 where the spec asks), whatever the training precision: approximate
  // convolutions read fp32 activations, and every assignment is compared on one footing.
  PlanOptions options = PlanOptionsForSpec(s.spec);
  if (options.precision == kernels::Precision::kBf16) options.precision = kernels::Precision::kFp32;
  TOPIARY_ASSIGN_OR_RETURN(
      auto net, Network::Plan(model.get(), s.spec.data().eval_batch_size(), false, options));
  const int64_t images = static_cast<int64_t>(s.data.test.size());
  TOPIARY_ASSIGN_OR_RETURN(auto result, topiary::Evaluate(*net, *s.batches, images));
  if (code_use != nullptr && approx.rules_size() > 0) {
    TOPIARY_ASSIGN_OR_RETURN(*code_use, MeasureCodeUses(*net, *model, approx, *s.batches, images));
  }
  return result;
}

namespace {

// Mean seconds per call of net.Forward(false) replayed as a captured graph (eager on the
// CPU), over about `seconds` after a warm-up; the board's joules over the same calls (-1
// without a meter).
struct ForwardTiming {
  double seconds_per_call = 0, joules = -1;
  int calls = 0;
};
absl::StatusOr<ForwardTiming> TimeForward(Network& net, Device* device, EnergyMeter* meter,
                                          double seconds) {
  using Clock = std::chrono::steady_clock;
  StepRunner runner(
      device, [&] { return net.Forward(false); }, /*use_graph=*/true,
      /*eager_steps=*/1);
  for (int i = 0; i < 3; ++i) TOPIARY_RETURN_IF_ERROR(runner.Run());
  TOPIARY_RETURN_IF_ERROR(device->Synchronize());
  auto timed = [&](int calls) -> absl::StatusOr<double> {
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < calls; ++i) TOPIARY_RETURN_IF_ERROR(runner.Run());
    TOPIARY_RETURN_IF_ERROR(device->Synchronize());
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  TOPIARY_ASSIGN_OR_RETURN(auto probe, timed(10));
  ForwardTiming t;
  t.calls = std::max(10, static_cast<int>(seconds / std::max(probe / 10, 1e-6)));
  const double j0 = meter ? meter->Joules().value_or(-1) : -1;
  TOPIARY_ASSIGN_OR_RETURN(auto s, timed(t.calls));
  const double j1 = meter ? meter->Joules().value_or(-1) : -1;
  t.seconds_per_call = s / t.calls;
  if (j0 >= 0 && j1 >= 0) t.joules = j1 - j0;
  return t;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointEvaluator::Bench>> CheckpointEvaluator::BenchInference(
    int batch) {
  if (batch < 1 || batch > 65536) {
    return absl::InvalidArgumentError("--batch: must be in [1, 65536]");
  }
  const State& s = *state_;
  auto m = EnergyMeter::ForDevice(*s.device);  // without one: no energy figures
  std::unique_ptr<EnergyMeter> meter = m.ok() ? std::move(*m) : nullptr;
  std::vector<Bench> out;
  for (BlockSparseMode mode : {BlockSparseMode::kOff, BlockSparseMode::kAuto}) {
    Bench b;
    b.engine = mode == BlockSparseMode::kOff ? "dense" : "dispatch";
    b.batch = batch;
    TOPIARY_ASSIGN_OR_RETURN(auto model, s.MakeModel(/*load=*/true, &s.spec.approximation()));
    PlanOptions options = PlanOptionsForSpec(s.spec);  // deterministic too, as trained
    options.block_sparse = mode;
    TOPIARY_ASSIGN_OR_RETURN(auto net, Network::Plan(model.get(), batch, false, options));
    // The evaluation's first pass is where each masked layer measures its kernels.
    TOPIARY_ASSIGN_OR_RETURN(
        auto acc, topiary::Evaluate(*net, *s.batches, static_cast<int64_t>(s.data.test.size())));
    b.accuracy = acc;
    b.multiply_adds = MultiplyAdds(*model);
    b.parameters = model->trainable_parameter_count();
    for (const auto& [layer, c] : net->SparseConvChoices()) b.block_sparse_passes += c.sparse[0];
    TOPIARY_ASSIGN_OR_RETURN(auto big, TimeForward(*net, s.device.get(), meter.get(), 1.0));
    b.images_per_s = batch / big.seconds_per_call;
    if (big.joules > 0) b.joules_per_image = big.joules / (static_cast<double>(batch) * big.calls);
    net.reset();

    TOPIARY_ASSIGN_OR_RETURN(auto one, Network::Plan(model.get(), 1, false, options));
    TOPIARY_RETURN_IF_ERROR(one->Forward(false));  // the batch-1 measurements
    // Per layer, eager: the device synchronized after each layer.
    std::vector<double> layer_s(model->nodes().size(), 0.0);
    for (int rep = 0; rep < 2; ++rep) {  // the second pass is the one kept
      auto last = std::chrono::steady_clock::now();
      one->set_layer_hook([&](int node, bool) -> absl::Status {
        TOPIARY_RETURN_IF_ERROR(s.device->Synchronize());
        const auto now = std::chrono::steady_clock::now();
        layer_s[node] = std::chrono::duration<double>(now - last).count();
        last = now;
        return absl::OkStatus();
      });
      TOPIARY_RETURN_IF_ERROR(s.device->Synchronize());
      last = std::chrono::steady_clock::now();
      TOPIARY_RETURN_IF_ERROR(one->Forward(false));
    }
    one->set_layer_hook(nullptr);
    for (size_t j = 0; j < layer_s.size(); ++j) {
      const Layer* layer = model->nodes()[j].layer;
      if (layer->kind() == LayerKind::kConv2d)
        b.layer_ms.emplace_back(layer->name(), 1e3 * layer_s[j]);
    }
    TOPIARY_ASSIGN_OR_RETURN(auto single, TimeForward(*one, s.device.get(), nullptr, 0.5));
    b.batch1_ms = 1e3 * single.seconds_per_call;
    out.push_back(std::move(b));
  }
  return out;
}

namespace {

// A greedy step's candidate: multiplier `multiplier` on row `row`, saving `saving` (MACs x
// mW) for an accuracy drop of `drop` points measured alone.
struct Candidate {
  size_t row;
  int multiplier;
  double saving, drop;
};

// The candidates that save power, cheapest accuracy per unit of saved power first (ties:
// the larger saving). Multipliers without a known power go to report->unknown_power.
std::vector<Candidate> GreedyCandidates(double p_exact, SensitivityReport* report) {
  std::vector<Candidate> candidates;
  for (size_t j = 0; j < report->multipliers.size(); ++j) {
    const Multiplier& m = report->multipliers[j];
    if (!m.known) {
      report->unknown_power.push_back(m.name);
      continue;
    }
    for (size_t i = 0; i < report->rows.size(); ++i) {
      const double saving = report->rows[i].layer.macs * (p_exact - m.known->power_mw);
      const double drop = std::max(0.0, report->float_top1 - report->rows[i].top1[j]);
      if (saving > 0) candidates.push_back({i, static_cast<int>(j), saving, drop});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     return a.drop * b.saving < b.drop * a.saving ||
                            (a.drop * b.saving == b.drop * a.saving && a.saving > b.saving);
                   });
  return candidates;
}

// The chosen multiplier of each row (-1: exact) as the report's assignment, and its power
// relative to exact multipliers everywhere.
void SetAssignment(const std::vector<int>& chosen, double p_exact, SensitivityReport* report) {
  double power = 0, power_exact = 0;
  for (size_t i = 0; i < chosen.size(); ++i) {
    const double macs = static_cast<double>(report->rows[i].layer.macs);
    power_exact += macs * p_exact;
    if (chosen[i] < 0) {
      power += macs * p_exact;
    } else {
      power += macs * report->multipliers[chosen[i]].known->power_mw;
      report->assignment.emplace_back(report->rows[i].layer.name, chosen[i]);
    }
  }
  report->relative_power = power_exact > 0 ? power / power_exact : 1;
}

}  // namespace

absl::StatusOr<SensitivityReport> Sensitivity(CheckpointEvaluator& evaluator,
                                              const std::vector<std::string>& multipliers,
                                              double budget_pts, const ApproximationSpec& base,
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
  const auto& convs = evaluator.conv_layers();
  const int per_layer = static_cast<int>(convs.size() * multipliers.size());
  int done = 0, total = 1 + per_layer;
  auto step = [&] {
    ++done;
    if (progress) progress(done, total);
  };
  auto top1 = [&](const std::vector<std::pair<std::string, std::string>>& layers,
                  std::vector<CodeUse>* code_use = nullptr) -> absl::StatusOr<double> {
    TOPIARY_ASSIGN_OR_RETURN(auto r, evaluator.Evaluate(AssignmentRules(base, layers), code_use));
    step();
    return 100.0 * r.top1;
  };

  TOPIARY_ASSIGN_OR_RETURN(auto f, top1({}));
  report.float_top1 = f;
  for (const ConvLayerInfo& layer : convs) {
    SensitivityReport::Row row{layer, {}, {}};
    for (const std::string& m : multipliers) {
      std::vector<CodeUse> use;  // the one approximate layer's
      TOPIARY_ASSIGN_OR_RETURN(auto t, top1({{layer.name, m}}, &use));
      row.top1.push_back(t);
      row.code_use.push_back(use.empty() ? CodeUse{} : use[0]);
    }
    report.rows.push_back(std::move(row));
  }

  // Greedy: the candidates (layer, multiplier) that save power, cheapest accuracy per unit of
  // saved power first; each is kept when the whole assignment, measured, stays in budget.
  auto exact = LoadMultiplier("exact");
  if (!exact.ok() || !exact->known) return absl::InternalError("the exact multiplier's power");
  const double p_exact = exact->known->power_mw;
  const std::vector<Candidate> candidates = GreedyCandidates(p_exact, &report);
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
    TOPIARY_ASSIGN_OR_RETURN(auto t, top1(layers));
    if (report.float_top1 - t <= budget_pts) {
      saved[c.row] = c.saving;
      report.assigned_top1 = t;
    } else {
      chosen[c.row] = before;
    }
  }
  SetAssignment(chosen, p_exact, &report);
  return report;
}

}  // namespace topiary
