// Training-step throughput: forward + loss + backward + SGD update of a zoo model on random
// data, timed over many steps after a warm-up. Prints one JSON line per model.
//
//   train_step_bench [--models lenet5,resnet20] [--batch 128] [--hw 28] [--channels 1]
//                    [--classes 10] [--steps 20] [--threads 0] [--device cpu|cuda]
//                    [--graphs 1] [--precision fp32|tf32|bf16] [--approx MULTIPLIER]
//                    [--sample 'GRADIENT_SAMPLING_TEXTPROTO'] [--prune ZERO_FRACTION [--block
//                    INxOUT]]
//                    [--inference 1] [--search_seconds S] [--profile 1 [--peak_gbps 3350]]
//                    [--keep_flops F [--round_to 8]] [--fuse 0|1] [--moments 0|1] [--report 1]
// --fuse 0 runs every layer on its own on a GPU: no fused residual tails, no batch-norm
// moments from convolution epilogues (A/B of the fusions); --moments 0 turns off the latter
// alone (PlanOptions::fuse_batch_norm_moments; TOPIARY_CONV_MOMENTS=on forces it).
// --report 1 prints the plan report (Network::PlanReport: what runs each layer) to stderr,
// after the timed steps (block-sparse choices are measured on the first eager step).
// --approx makes every 3x3 (not 1x1) convolution approximate with that multiplier.
// --sample samples weight gradients on every timed step in the layers the block (the body of
// a spec's gradient_sampling block, e.g. 'every_other: true top_k: 1') selects; a policy
// that samples a fraction f of the steps costs (1 - f) * exact + f * sampled.
// --prune installs block masks (8x8, or --block INxOUT) with that fraction of zero blocks on every
// convolution the block pruner may prune (both grid sides > 1), balanced as
// pruning { balanced: true } leaves them, at random; with TOPIARY_SPARSE_CONV unset, each pass of
// each masked layer then runs on the block-sparse kernels or cuDNN, whichever measures faster (=on
// forces block-sparse, =off dense).
// --keep_flops F compacts the model first (channel pruning, docs/algorithms.md §3a): L1-scored
// channels removed across the dependency groups until F of the multiply-adds are left, kept
// counts rounded up to multiples of --round_to; "macs" reports the model's multiply-adds.
// --inference 1 times the forward pass of an inference network instead of training steps.
// On a GPU with NVML, joules_per_image is the board's energy over the timed steps per image.
// On a GPU the step is captured as a CUDA graph (unless --graphs 0), as the runner does.
// plan_s is Network::Plan's time; convs_cached/measured/untimed say how its convolution plans
// were made (the plan cache: TOPIARY_PLAN_CACHE, default ~/.cache/topiary/conv_plans.tsv).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/text_format.h"
#include "pruning/channel_select.h"
#include "tests/benchmarks/block_grid_util.h"
#include "trainer/approx/approximation.h"
#include "trainer/core/energy.h"
#include "trainer/nn/channels.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/optim/optimizer.h"
#include "trainer/run/gradient_sampling.h"
#include "trainer/run/step_runner.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// Balanced random block masks (block_grid_util.h) with `zeros` of the blocks zero on every
// convolution the block pruner may prune (both grid sides > 1).
absl::Status RandomBlockMasks(Model* model, double zeros, int block_in, int block_out) {
  std::mt19937 gen(5);
  for (const auto& node : model->nodes()) {
    if (node.layer->kind() != LayerKind::kConv2d) continue;
    for (Parameter* p : node.layer->parameters()) {
      if (p->role != ParamRole::kKernel) continue;
      const int k = p->value.shape()[0], taps = p->value.shape()[1] * p->value.shape()[2],
                c = p->value.shape()[3];
      MaskInfo info;
      info.kind = MaskInfo::Kind::kBlock;
      info.blocks = kernels::BlockGrid::Dense(c, k, block_in, block_out);
      if (info.blocks.rows < 2 || info.blocks.cols < 2) continue;
      info.blocks = bench::BalancedGrid(c, k, block_in, block_out, 1.0 - zeros, gen);
      const auto mask = info.blocks.Expand(k, taps, c);
      TOPIARY_RETURN_IF_ERROR(InstallMask(p, mask, std::move(info)));
    }
  }
  return absl::OkStatus();
}

struct Flags {
  std::vector<std::string> models = {"lenet5", "resnet20"};
  int batch = 128, hw = 28, channels = 1, classes = 10, steps = 20, warmup = 3, threads = 0;
  std::string device = "cpu", precision = "fp32", approx;
  std::optional<std::string> sample;  // a GradientSamplingSpec in text format
  double prune = 0;                   // zero fraction of blocks
  int block_in = 8, block_out = 8;    // --block INxOUT: the blocks --prune masks
  double keep_flops = 0;              // channel pruning: the share of multiply-adds kept
  int round_to = 8;
  bool inference = false;
  bool graphs = true;
  bool profile = false;        // time every layer (synchronizing after each): where the time goes
  double peak_gbps = 3350;     // --profile's memory floor: the GPU's DRAM bandwidth (H100 SXM)
  bool deterministic = false;  // only cuDNN algorithms that give the same bits every run
  double search_seconds = PlanOptions{}.search_seconds;
  bool fuse = true;     // fused residual tails on a GPU (PlanOptions::fuse_residual_tails)
  bool moments = true;  // batch-norm moments from convolutions (fuse_batch_norm_moments)
  bool report = false;  // print the plan report
};

// The activation bytes a layer's pass must move at least once: forward reads its inputs and
// writes its output; backward reads the output gradient and the inputs and writes the input
// gradients (parameters, workspaces and re-reads not counted): the memory floor's numerator.
double PassBytes(const Model& model, const Model::Node& node, bool backward, int batch,
                 int elem_bytes) {
  auto bytes = [&](int value) {
    return static_cast<double>(model.value_shapes()[value].per_image()) * batch * elem_bytes;
  };
  double in = 0;
  for (int v : node.inputs) in += bytes(v);
  return backward ? bytes(node.output) + 2 * in : in + bytes(node.output);
}

// Per layer type and pass: milliseconds per step, synchronizing after every layer (so the
// total exceeds a normal step's time; the shares are what matter), and the pass's memory
// floor: its activation bytes (PassBytes) at --peak_gbps, so memory-bound layers far from
// their floor stand out.
absl::Status Profile(const Flags& f, const std::string& arch, Model& model, Network& net,
                     Device* dev, const std::function<absl::Status()>& step) {
  std::map<std::string, double> ms, bytes;
  const int elem_bytes = f.precision == "bf16" ? 2 : 4;
  auto last = std::chrono::steady_clock::now();
  net.set_layer_hook([&](int node, bool backward) -> absl::Status {
    TOPIARY_RETURN_IF_ERROR(dev->Synchronize());
    const auto now = std::chrono::steady_clock::now();
    const Model::Node& n = model.nodes()[node];
    const std::string what = std::string(n.layer->type()) +
                             (net.in_residual_tail(node) ? " (tail)" : "") +
                             (backward ? " backward" : " forward");
    ms[what] += std::chrono::duration<double, std::milli>(now - last).count();
    bytes[what] += PassBytes(model, n, backward, f.batch, elem_bytes);
    last = now;
    return absl::OkStatus();
  });
  for (int i = 0; i < f.steps; ++i) {
    TOPIARY_RETURN_IF_ERROR(dev->Synchronize());
    last = std::chrono::steady_clock::now();
    TOPIARY_RETURN_IF_ERROR(step());
  }
  TOPIARY_RETURN_IF_ERROR(dev->Synchronize());
  net.set_layer_hook(nullptr);
  for (const auto& [what, total] : ms) {
    const double gb = bytes[what] / f.steps / 1e9;
    absl::PrintF(
        "{\"profile\":\"%s\",\"what\":\"%s\",\"ms_per_step\":%.3f,\"activation_gb\":%.3f,"
        "\"floor_ms\":%.3f}\n",
        arch, what, total / f.steps, gb, 1e3 * gb / f.peak_gbps);
  }
  return absl::OkStatus();
}

absl::Status Bench(const Flags& f, const std::string& arch) {
  topiary::v1::DeviceSpec ds;
  ds.set_kind(f.device == "cuda" ? topiary::v1::DeviceSpec::CUDA : topiary::v1::DeviceSpec::CPU);
  ds.set_threads(f.threads);
  auto dev = CreateDevice(ds);
  if (!dev.ok()) return dev.status();
  auto model = BuildModel(arch, 1.0f, {1, f.hw, f.hw, f.channels}, f.classes, dev->get());
  if (!model.ok()) return model.status();
  (*model)->Initialize(1);
  if (f.keep_flops > 0) {
    topiary::v1::PruningSpec p;
    p.set_method(topiary::v1::PruningSpec::CHANNEL);
    p.set_score(topiary::v1::PruningSpec::L1);
    p.set_target_flops(static_cast<float>(f.keep_flops));
    p.set_step_fraction(1);
    p.set_round_to(f.round_to);
    p.set_min_channels(1);
    TOPIARY_ASSIGN_OR_RETURN(ChannelGroups groups, FindChannelGroups(**model));
    TOPIARY_ASSIGN_OR_RETURN(pruning::ChannelChoice choice,
                             pruning::ChooseChannels(**model, groups, p, 1, nullptr));
    TOPIARY_ASSIGN_OR_RETURN(*model, CompactModel(**model, groups, choice.remove));
  }
  if (!f.approx.empty()) {
    topiary::v1::ApproximationSpec a;
    a.add_rules()->set_layer("*");
    a.mutable_rules(0)->set_multiplier(f.approx);
    a.add_rules()->set_layer("*shortcut.conv");  // the 1x1 projections stay exact
    a.mutable_rules(1)->set_exclude(true);
    bool shortcuts = false;  // a rule that matches nothing is an error
    for (const auto& node : (*model)->nodes()) {
      shortcuts = shortcuts || node.layer->name().find("shortcut.conv") != std::string::npos;
    }
    if (!shortcuts) a.mutable_rules()->RemoveLast();
    TOPIARY_RETURN_IF_ERROR(ApplyApproximation(a, model->get()));
  }
  if (f.sample) {
    topiary::v1::GradientSamplingSpec g;
    if (!google::protobuf::TextFormat::ParseFromString(*f.sample, &g)) {
      return absl::InvalidArgumentError("--sample: not a gradient_sampling block: " + *f.sample);
    }
    if (g.top_k() == 0) g.set_top_k(1);
    auto applied = ApplyGradientSampling(g, model->get());
    if (!applied.ok()) return applied.status();
    SetSampling(model->get(), true);
  }
  if (f.prune > 0)
    TOPIARY_RETURN_IF_ERROR(RandomBlockMasks(model->get(), f.prune, f.block_in, f.block_out));
  PlanOptions options;
  options.precision = f.precision == "bf16"   ? kernels::Precision::kBf16
                      : f.precision == "tf32" ? kernels::Precision::kTf32
                                              : kernels::Precision::kFp32;
  options.deterministic = f.deterministic;
  options.fuse_residual_tails = f.fuse;
  options.fuse_batch_norm_moments = f.fuse && f.moments;
  options.search_seconds = f.search_seconds;
  auto net = Network::Plan(model->get(), f.batch, !f.inference, options);
  if (!net.ok()) return net.status();
  const PlanProgress plan = (*net)->plan_progress();
  topiary::v1::OptimizerSpec spec;
  spec.set_lr(0.01f);
  spec.set_momentum(0.9f);
  spec.set_weight_decay(5e-4f);
  SgdOptimizer opt((*model)->parameters(), spec, dev->get());
  const int total_steps = f.warmup + f.steps + 2;
  auto clock = TrainingClock::Create(dev->get(), std::vector<float>(total_steps, 0.01f));
  if (!clock.ok()) return clock.status();
  TOPIARY_RETURN_IF_ERROR(clock->BeginEpoch(0, 0));

  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  std::vector<float> x(static_cast<size_t>(f.batch) * f.hw * f.hw * f.channels);
  for (auto& v : x) v = dist(gen);
  std::vector<int32_t> labels(f.batch);
  for (int i = 0; i < f.batch; ++i) labels[i] = i % f.classes;
  (*dev)->CopyFromHost((*net)->input(), x.data(), x.size() * sizeof(float));
  (*dev)->CopyFromHost((*net)->labels(), labels.data(), labels.size() * sizeof(int32_t));

  auto step = [&]() -> absl::Status {
    if (f.inference) return (*net)->Forward(false);
    TOPIARY_RETURN_IF_ERROR(clock->Tick(f.batch));
    TOPIARY_RETURN_IF_ERROR((*net)->Forward(true));
    TOPIARY_RETURN_IF_ERROR((*net)->Loss(0.0f));
    TOPIARY_RETURN_IF_ERROR((*net)->Backward());
    return opt.Step(clock->clock());
  };
  // As the runner does: eager warm-up steps, then (on a GPU) the step captured and replayed.
  StepRunner runner(dev->get(), step, f.graphs, f.warmup);
  for (int i = 0; i <= f.warmup; ++i) TOPIARY_RETURN_IF_ERROR(runner.Run());
  TOPIARY_RETURN_IF_ERROR((*dev)->Synchronize());
  // The board's energy over the timed steps, where NVML is there (give the loop a few
  // seconds: the counter advances in steps of tens of milliseconds).
  auto m = EnergyMeter::ForDevice(**dev);  // without one: joules_per_image 0
  std::unique_ptr<EnergyMeter> meter = m.ok() ? std::move(*m) : nullptr;
  const double j0 = meter ? meter->Joules().value_or(-1) : -1;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < f.steps; ++i) TOPIARY_RETURN_IF_ERROR(runner.Run());
  TOPIARY_RETURN_IF_ERROR((*dev)->Synchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double j1 = meter ? meter->Joules().value_or(-1) : -1;
  const double joules_per_image =
      j0 >= 0 && j1 >= 0 ? (j1 - j0) / (static_cast<double>(f.batch) * f.steps) : 0;
  if (f.inference) TOPIARY_RETURN_IF_ERROR((*net)->Loss(0.0f));  // for the metrics read below
  auto metrics = (*net)->TakeMetrics();
  if (!metrics.ok()) return metrics.status();
  int sparse_passes = 0, masked_layers = 0;  // the choices are in TOPIARY_CONV_LOG's lines
  for (const auto& [layer, c] : (*net)->SparseConvChoices()) {
    ++masked_layers;
    for (bool b : c.sparse) sparse_passes += b;
  }
  // After the steps: the block-sparse dispatch measures on the first eager step.
  if (f.report) {
    for (const std::string& line : (*net)->PlanReport()) absl::FPrintF(stderr, "%s\n", line);
  }
  if (f.profile) TOPIARY_RETURN_IF_ERROR(Profile(f, arch, **model, **net, dev->get(), step));
  absl::PrintF(
      "{\"engine\":\"topiary\",\"model\":\"%s\",\"batch\":%d,\"input\":\"%dx%dx%d\","
      "\"device\":\"%s\",\"precision\":\"%s\",\"graphs\":%s,\"threads\":%d,"
      "\"deterministic\":%s,\"approx\":\"%s\",\"sample\":\"%s\",\"prune\":%.3f,"
      "\"inference\":%s,\"masked_layers\":%d,\"block_sparse_passes\":%d,"
      "\"joules_per_image\":%.6f,\"images_per_s\":%.1f,\"ms_per_step\":%.3f,"
      "\"planned_mb\":%.1f,\"activation_mb\":%.1f,\"device_mb\":%.1f,\"plan_s\":%.2f,"
      "\"convs_cached\":%d,\"convs_measured\":%d,\"convs_untimed\":%d,\"graph_nodes\":%d,"
      "\"keep_flops\":%.3f,\"macs\":%d,\"parameters\":%d,\"residual_tails\":%d,"
      "\"loss\":%.4f}\n",
      arch, f.batch, f.hw, f.hw, f.channels, (*dev)->name(), f.precision,
      runner.captured() ? "true" : "false", f.threads, f.deterministic ? "true" : "false", f.approx,
      f.sample ? *f.sample : "", f.prune, f.inference ? "true" : "false", masked_layers,
      sparse_passes, joules_per_image, f.batch * f.steps / s, 1000 * s / f.steps,
      (*net)->planned_bytes() / 1048576.0, (*net)->activation_bytes() / 1048576.0,
      (*dev)->allocated_bytes() / 1048576.0, plan.seconds, plan.convs_cached, plan.convs_measured,
      plan.convs_untimed, static_cast<int>(runner.graph_nodes()), f.keep_flops,
      MultiplyAdds(**model), (*model)->trainable_parameter_count(), (*net)->residual_tails(),
      metrics->loss());
  return absl::OkStatus();
}

}  // namespace
}  // namespace topiary

int main(int argc, char** argv) {
  topiary::Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--models")
      f.models = absl::StrSplit(v, ',');
    else if (k == "--batch")
      f.batch = std::stoi(v);
    else if (k == "--hw")
      f.hw = std::stoi(v);
    else if (k == "--channels")
      f.channels = std::stoi(v);
    else if (k == "--classes")
      f.classes = std::stoi(v);
    else if (k == "--steps")
      f.steps = std::stoi(v);
    else if (k == "--threads")
      f.threads = std::stoi(v);
    else if (k == "--device")
      f.device = v;
    else if (k == "--graphs")
      f.graphs = v != "0";
    else if (k == "--approx")
      f.approx = v;
    else if (k == "--prune")
      f.prune = std::atof(v.c_str());
    else if (k == "--block") {
      if (!topiary::bench::ParseBlockShape(v.c_str(), &f.block_in, &f.block_out)) {
        absl::FPrintF(stderr, "--block wants INxOUT, e.g. 64x128\n");
        return 2;
      }
    } else if (k == "--keep_flops")
      f.keep_flops = std::atof(v.c_str());
    else if (k == "--round_to")
      f.round_to = std::atoi(v.c_str());
    else if (k == "--inference")
      f.inference = v == "1";
    else if (k == "--sample")
      f.sample = v;
    else if (k == "--precision")
      f.precision = v;
    else if (k == "--profile")
      f.profile = v != "0";
    else if (k == "--peak_gbps")
      f.peak_gbps = std::stod(v);
    else if (k == "--search_seconds")
      f.search_seconds = std::stod(v);
    else if (k == "--fuse")
      f.fuse = v != "0";
    else if (k == "--moments")
      f.moments = v != "0";
    else if (k == "--report")
      f.report = v != "0";
    else if (k == "--deterministic")
      f.deterministic = v != "0";
    else {
      absl::FPrintF(stderr, "unknown flag %s\n", k);
      return 2;
    }
  }
  int rc = 0;
  for (const auto& m : f.models) {
    const absl::Status st = topiary::Bench(f, m);
    if (!st.ok()) {
      absl::FPrintF(stderr, "%s: %s\n", m, st.ToString());
      rc = 1;
    }
  }
  return rc;
}
