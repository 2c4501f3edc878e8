#include "clients/approx_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/report_print.h"
#include "clients/text.h"
#include "trainer/approx/approximation.h"
#include "trainer/approx/error_png.h"
#include "trainer/approx/multiplier.h"
#include "trainer/approx/multiplier_info.h"
#include "trainer/run/approx_eval.h"
#include "trainer/run/events.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

std::string PowerJson(const Multiplier& m) {
  return m.known ? absl::StrFormat("%g", m.known->power_mw) : "null";
}

// --set PATTERN=MULTIPLIER (MULTIPLIER 'none': exact) as approximation rules, on the range
// mode and weight tuning of the checkpoint's own spec.
absl::StatusOr<topiary::v1::ApproximationSpec> RulesFromSets(
    const std::vector<std::string>& sets, const topiary::v1::ApproximationSpec& base) {
  std::vector<std::pair<std::string, std::string>> layers;
  for (const std::string& s : sets) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set '", OneLine(s),
                       "': expected PATTERN=MULTIPLIER (e.g. '*=mul8u_L40.bin', "
                       "'stem.conv=none')"));
    }
    const std::string multiplier = s.substr(eq + 1);
    layers.emplace_back(s.substr(0, eq), multiplier == "none" ? "" : multiplier);
  }
  return AssignmentRules(base, layers);
}

std::string WeightCodeName(const topiary::v1::ApproximationSpec& a) {
  return absl::AsciiStrToLower(topiary::v1::ApproximationSpec::WeightCode_Name(a.weight_code()));
}

// --weight_code and --weight_scales applied to `rules` (nothing when neither is given).
absl::Status ApplyWeightFlags(const std::string& weight_code, const std::string& weight_scales,
                              topiary::v1::ApproximationSpec* rules) {
  using topiary::v1::ApproximationSpec;
  if (!weight_code.empty()) {
    ApproximationSpec::WeightCode code;
    if (!ApproximationSpec::WeightCode_Parse(absl::AsciiStrToUpper(weight_code), &code)) {
      return absl::InvalidArgumentError(absl::StrCat("--weight_code '", OneLine(weight_code),
                                                     "': expected asymmetric or sign_magnitude"));
    }
    rules->set_weight_code(code);
    // Weight tuning remaps asymmetric codes; the sign-magnitude mode has its own table.
    if (code == ApproximationSpec::SIGN_MAGNITUDE) rules->set_weight_tuning(false);
  }
  if (!weight_scales.empty()) {
    if (weight_scales != "per_tensor" && weight_scales != "per_channel") {
      return absl::InvalidArgumentError(absl::StrCat("--weight_scales '", OneLine(weight_scales),
                                                     "': expected per_tensor or per_channel"));
    }
    rules->set_per_channel_weights(weight_scales == "per_channel");
  }
  return absl::OkStatus();
}

// The layers whose multiplier errs far more at the codes they use than its table-wide
// metrics say (CodeUse::far), as warnings on stderr; with TFApprox's codes, a hint at the
// sign-magnitude mode.
void WarnFarCodeUse(const std::vector<CodeUse>& uses,
                    const topiary::v1::ApproximationSpec& approx) {
  const bool asymmetric = approx.weight_code() == topiary::v1::ApproximationSpec::ASYMMETRIC;
  for (const CodeUse& u : uses) {
    if (!u.far) continue;
    absl::FPrintF(stderr,
                  "warning: %s: %s errs by %.2f%% of the products at the codes this layer uses, "
                  "against %.2f%% over its whole table: expect more accuracy loss than the "
                  "table's metrics suggest%s\n",
                  u.layer, OneLine(u.multiplier), u.used_error_pct, u.table_error_pct,
                  asymmetric ? " (try --weight_code sign_magnitude)" : "");
  }
}

// Sensitivity measures every (layer, multiplier): one warning line per multiplier, naming
// how many layers it errs far for and the median figures over those layers.
void WarnFarCodeUseByMultiplier(const SensitivityReport& r,
                                const topiary::v1::ApproximationSpec& approx) {
  const bool asymmetric = approx.weight_code() == topiary::v1::ApproximationSpec::ASYMMETRIC;
  for (size_t m = 0; m < r.multipliers.size(); ++m) {
    std::vector<double> used;
    double table = 0;
    for (const auto& row : r.rows) {
      if (m >= row.code_use.size() || !row.code_use[m].far) continue;
      used.push_back(row.code_use[m].used_error_pct);
      table = row.code_use[m].table_error_pct;
    }
    if (used.empty()) continue;
    std::sort(used.begin(), used.end());
    absl::FPrintF(stderr,
                  "warning: %s errs by %.2f%% of the products (median) at the codes %d of %d "
                  "layers use, against %.2f%% over its whole table: expect more accuracy loss "
                  "than its metrics suggest%s\n",
                  OneLine(r.multipliers[m].name), used[used.size() / 2], used.size(), r.rows.size(),
                  table, asymmetric ? " (try --weight_code sign_magnitude)" : "");
  }
}

std::string CodeUseJson(const std::vector<CodeUse>& uses) {
  std::vector<std::string> out;
  for (const CodeUse& u : uses) {
    out.push_back(absl::StrFormat(
        R"({"layer":%s,"multiplier":%s,"used_error_pct":%.6g,"table_error_pct":%.6g,"far":%s})",
        JsonString(u.layer), JsonString(u.multiplier), u.used_error_pct, u.table_error_pct,
        u.far ? "true" : "false"));
  }
  return absl::StrCat("[", absl::StrJoin(out, ","), "]");
}

// "evaluating 12/127" on a terminal, redrawn in place.
std::function<void(int, int)> TerminalProgress(const char* what) {
  if (isatty(STDERR_FILENO) == 0) return nullptr;
  return [what](int done, int total) {
    absl::FPrintF(stderr, "\r%s %d/%d", what, done, total);
    if (done == total) absl::FPrintF(stderr, "\n");
  };
}

}  // namespace

int MultipliersCommand(const Args& a) {
  std::vector<std::string> names = a.positional;
  if (names.empty()) {
    names = {"exact", "trunc:2", "trunc:4", "bam:6", "bam:8", "mitchell", "drum:4", "drum:6"};
  }
  std::vector<topiary::v1::MultiplierInfo> rows;  // all first: an error prints no partial table
  for (const std::string& name : names) {
    auto m = LoadMultiplier(name);
    if (!m.ok()) return Fail(a, m.status());
    rows.push_back(DescribeMultiplier(*m));
    if (!a.png.empty()) {
      if (names.size() != 1) {
        return Fail(a, absl::InvalidArgumentError("--png: name exactly one multiplier"));
      }
      if (auto st = WriteFileAtomic(a.png, ErrorSurfacePng(m->table)); !st.ok()) {
        return Fail(a, st);
      }
      // On stderr: --json keeps stdout to the JSON rows.
      absl::FPrintF(stderr,
                    "wrote %s: %s's error T[a,w] - a*w, a down, w across, red too large, blue "
                    "too small\n",
                    a.png, m->name);
    }
  }
  PrintMultipliers(a.json, rows);
  return kExitOk;
}

// One checkpoint's --bench measurements.
struct Benched {
  std::string path;
  std::vector<CheckpointEvaluator::Bench> benches;
};

void PrintBenchJson(const Benched& m, const std::string& role, const std::string& device) {
  for (const auto& b : m.benches) {
    std::vector<std::string> layers;
    for (const auto& [name, ms] : b.layer_ms) {
      layers.push_back(absl::StrFormat(R"({"layer":%s,"ms":%.5f})", JsonString(name), ms));
    }
    absl::PrintF(
        R"({"checkpoint":%s,"role":"%s","device":%s,"engine":"%s","top1":%.6g,"loss":%.6g,)"
        R"("batch":%d,"images_per_s":%.1f,"batch1_ms":%.5f,"joules_per_image":%.6g,)"
        R"("block_sparse_passes":%d,"multiply_adds":%d,"parameters":%d,"layers":[%s]})"
        "\n",
        JsonString(m.path), role, JsonString(device), b.engine, b.accuracy.top1, b.accuracy.loss,
        b.batch, b.images_per_s, b.batch1_ms, b.joules_per_image, b.block_sparse_passes,
        b.multiply_adds, b.parameters, absl::StrJoin(layers, ","));
  }
}

void PrintBenchTable(const Benched& m, const std::string& device) {
  const auto& first = m.benches[0];
  absl::PrintF("%s on %s, %d test images, %.4g M multiply-adds per image, %.4g M parameters\n\n",
               m.path, device, first.accuracy.images, first.multiply_adds / 1e6,
               first.parameters / 1e6);
  absl::PrintF("%-9s %8s %8s %14s %12s %12s %s\n", "engine", "top-1", "loss",
               absl::StrFormat("img/s (b%d)", first.batch), "1 image ms", "J/image",
               "block-sparse passes");
  for (const auto& b : m.benches) {
    absl::PrintF("%-9s %7.2f%% %8.4f %14.0f %12.4f %12s %d\n", b.engine, 100 * b.accuracy.top1,
                 b.accuracy.loss, b.images_per_s, b.batch1_ms,
                 b.joules_per_image > 0 ? absl::StrFormat("%.5f", b.joules_per_image) : "-",
                 b.block_sparse_passes);
  }
  absl::PrintF("\none image per convolution (ms, eager, synchronized per layer)\n%-30s", "layer");
  for (const auto& b : m.benches) absl::PrintF(" %10s", b.engine);
  absl::PrintF("\n");
  for (size_t i = 0; i < first.layer_ms.size(); ++i) {
    absl::PrintF("%-30s", first.layer_ms[i].first);
    for (const auto& b : m.benches) absl::PrintF(" %10.4f", b.layer_ms[i].second);
    absl::PrintF("\n");
  }
}

// The checkpoint against its baseline, engine by engine: speed-ups above 1 mean the
// checkpoint is faster (throughput, latency) or spends less energy per image.
void PrintComparison(const Benched& m, const Benched& base, bool json) {
  for (size_t i = 0; i < m.benches.size() && i < base.benches.size(); ++i) {
    const auto& b = m.benches[i];
    const auto& d = base.benches[i];
    const double macs = d.multiply_adds > 0 ? double(b.multiply_adds) / d.multiply_adds : 0;
    const double params = d.parameters > 0 ? double(b.parameters) / d.parameters : 0;
    const double throughput = d.images_per_s > 0 ? b.images_per_s / d.images_per_s : 0;
    const double latency = b.batch1_ms > 0 ? d.batch1_ms / b.batch1_ms : 0;
    const double energy = b.joules_per_image > 0 ? d.joules_per_image / b.joules_per_image : 0;
    if (json) {
      absl::PrintF(R"({"compare":"%s","checkpoint":%s,"baseline":%s,"multiply_adds_share":%.6g,)"
                   R"("parameters_share":%.6g,"throughput_speedup":%.4g,"latency_speedup":%.4g,)"
                   R"("energy_ratio":%.4g,"top1_change":%.6g})"
                   "\n",
                   b.engine, JsonString(m.path), JsonString(base.path), macs, params, throughput,
                   latency, energy, b.accuracy.top1 - d.accuracy.top1);
      continue;
    }
    if (i == 0) {
      absl::PrintF("\n%s against %s:\n%-9s %14s %11s %12s %14s %14s %9s\n", m.path, base.path,
                   "engine", "multiply-adds", "parameters", "img/s", "1-image speed",
                   "energy/image", "top-1");
    }
    absl::PrintF("%-9s %13.1f%% %10.1f%% %11.2fx %13.2fx %14s %+8.2f\n", b.engine, 100 * macs,
                 100 * params, throughput, latency,
                 energy > 0 ? absl::StrFormat("%.2fx less", energy) : "-",
                 100 * (b.accuracy.top1 - d.accuracy.top1));
  }
}

// evaluate --bench: per engine, accuracy, throughput, latency, energy; then per conv layer;
// with --baseline, the same for the baseline checkpoint and the ratios.
int BenchCommand(const Args& a, CheckpointEvaluator& ev) {
  if (!a.sets.empty() || !a.multipliers.empty()) {
    return Fail(a, absl::InvalidArgumentError(
                       "--bench measures the checkpoint as trained: no --set or --multipliers"));
  }
  int batch = 256;
  if (!a.batch.empty() && (!absl::SimpleAtoi(a.batch, &batch) || batch < 1)) {
    return Fail(a,
                absl::InvalidArgumentError("--batch: a positive integer, not '" + a.batch + "'"));
  }
  std::optional<Benched> base;
  if (!a.baseline.empty()) {
    // The baseline first: its data and model are released before the checkpoint is measured.
    // ev's spec already holds --device: the baseline runs where the checkpoint runs.
    auto bev = CheckpointEvaluator::Open(a.baseline, ev.spec().device().kind());
    if (!bev.ok())
      return Fail(a, absl::Status(bev.status().code(),
                                  absl::StrCat("--baseline: ", bev.status().message())));
    auto benches = (*bev)->BenchInference(batch);
    if (!benches.ok()) return Fail(a, benches.status());
    base = Benched{a.baseline, std::move(*benches)};
  }
  auto benches = ev.BenchInference(batch);
  if (!benches.ok()) return Fail(a, benches.status());
  const Benched m{a.positional[0], std::move(*benches)};
  if (a.json) {
    PrintBenchJson(m, "checkpoint", ev.device_name());
    if (base) {
      PrintBenchJson(*base, "baseline", ev.device_name());
      PrintComparison(m, *base, true);
    }
    return kExitOk;
  }
  PrintBenchTable(m, ev.device_name());
  if (base) {
    absl::PrintF("\n");
    PrintBenchTable(*base, ev.device_name());
    PrintComparison(m, *base, false);
  }
  return kExitOk;
}

// evaluate's --device: the device kind it names (nullopt: the checkpoint's own).
absl::StatusOr<std::optional<topiary::v1::DeviceSpec::Kind>> DeviceFlag(const Args& a) {
  if (a.device.empty()) return std::nullopt;
  if (a.device == "cpu") return topiary::v1::DeviceSpec::CPU;
  if (a.device == "cuda" || a.device == "gpu") return topiary::v1::DeviceSpec::CUDA;
  return absl::InvalidArgumentError("--device: 'cpu' or 'cuda', not '" + a.device + "'");
}

// What evaluate's and sensitivity's --device, --data and --test_limit change.
EvaluatorOptions EvaluatorFlags(const Args& a,
                                std::optional<topiary::v1::DeviceSpec::Kind> device) {
  EvaluatorOptions options;
  options.device = device;
  options.data = a.data;
  options.test_limit = a.test_limit.value_or(0);
  return options;
}

// evaluate --multipliers: every convolution under each multiplier in turn, and under each
// weight code of --weight_code's comma-separated list: one row each, printed as it is measured.
int MultiplierTable(const Args& a, CheckpointEvaluator& ev) {
  if (!a.sets.empty()) {
    return Fail(a, absl::InvalidArgumentError(
                       "--multipliers and --set: give one or the other (--set assigns "
                       "multipliers per layer; --multipliers puts each on every convolution)"));
  }
  const std::vector<std::string> codes =
      a.weight_code.empty() ? std::vector<std::string>{""} : absl::StrSplit(a.weight_code, ',');
  std::vector<Multiplier> loaded;  // every name checked before the first evaluation
  for (const std::string& name : a.multipliers) {
    auto m = LoadMultiplier(name);
    if (!m.ok()) {
      return Fail(a, absl::Status(m.status().code(), absl::StrCat("--multipliers '", OneLine(name),
                                                                  "': ", m.status().message())));
    }
    loaded.push_back(std::move(*m));
  }
  if (!a.json) {
    absl::PrintF("%s on %s\n%-24s %-15s %8s %8s %8s %10s\n", a.positional[0], ev.device_name(),
                 "multiplier", "weight code", "top-1", "top-5", "loss", "power mW");
  }
  for (size_t i = 0; i < loaded.size(); ++i) {
    const std::string& name = a.multipliers[i];
    const Multiplier* m = &loaded[i];
    for (const std::string& code : codes) {
      auto rules = RulesFromSets({"*=" + name}, ev.spec().approximation());
      if (!rules.ok()) return Fail(a, rules.status());
      if (auto st = ApplyWeightFlags(code, a.weight_scales, &*rules); !st.ok()) return Fail(a, st);
      auto r = ev.Evaluate(*rules);
      if (!r.ok()) return Fail(a, r.status());
      if (a.json) {
        absl::PrintF(
            R"({"checkpoint":%s,"multiplier":%s,"weight_code":"%s","per_channel_weights":%s,)"
            R"("images":%d,"top1":%.6g,"top5":%.6g,"loss":%.6g,"power_mw":%s})"
            "\n",
            JsonString(a.positional[0]), JsonString(name), WeightCodeName(*rules),
            rules->per_channel_weights() ? "true" : "false", r->images, r->top1, r->top5, r->loss,
            PowerJson(*m));
      } else {
        absl::PrintF("%-24s %-15s %7.2f%% %7.2f%% %8.4f %10s\n", name, WeightCodeName(*rules),
                     100 * r->top1, 100 * r->top5, r->loss,
                     m->known ? absl::StrFormat("%.3f", m->known->power_mw) : "-");
      }
      std::fflush(stdout);
    }
  }
  return kExitOk;
}

int EvaluateCommand(const Args& a) {
  if (a.positional.size() != 1)
    return Fail(a, absl::InvalidArgumentError("evaluate needs exactly one checkpoint"));
  auto device = DeviceFlag(a);
  if (!device.ok()) return Fail(a, device.status());
  if (!a.baseline.empty() && !a.bench) {
    return Fail(a, absl::InvalidArgumentError("--baseline is for evaluate --bench"));
  }
  auto ev = CheckpointEvaluator::Open(a.positional[0], EvaluatorFlags(a, *device));
  if (!ev.ok()) return Fail(a, ev.status());
  if (a.bench) return BenchCommand(a, **ev);
  if (!a.multipliers.empty()) return MultiplierTable(a, **ev);
  std::optional<topiary::v1::ApproximationSpec> rules;
  if (!a.sets.empty()) {
    auto r = RulesFromSets(a.sets, (*ev)->spec().approximation());
    if (!r.ok()) return Fail(a, r.status());
    rules = *r;
  }
  if (!a.weight_code.empty() || !a.weight_scales.empty()) {
    if (!rules) rules = (*ev)->spec().approximation();
    if (auto st = ApplyWeightFlags(a.weight_code, a.weight_scales, &*rules); !st.ok())
      return Fail(a, st);
  }
  std::vector<CodeUse> code_use;
  auto result = (*ev)->Evaluate(rules, &code_use);
  if (!result.ok()) return Fail(a, result.status());
  WarnFarCodeUse(code_use, rules ? *rules : (*ev)->spec().approximation());
  const topiary::v1::ApproximationSpec& used = rules ? *rules : (*ev)->spec().approximation();
  std::vector<std::string> rule_text;
  for (const auto& r : used.rules()) {
    rule_text.push_back(
        a.json ? absl::StrFormat(R"({"layer":%s,"multiplier":%s})", JsonString(r.layer()),
                                 r.exclude() ? "null" : JsonString(r.multiplier()))
               : absl::StrCat(r.layer(), "=", r.exclude() ? "none" : r.multiplier()));
  }
  if (a.json) {
    absl::PrintF(
        R"({"checkpoint":%s,"device":%s,"images":%d,"top1":%.6g,"top5":%.6g,"loss":%.6g,"rules":[%s],)"
        R"("code_use":%s})"
        "\n",
        JsonString(a.positional[0]), JsonString((*ev)->device_name()), result->images, result->top1,
        result->top5, result->loss, absl::StrJoin(rule_text, ","), CodeUseJson(code_use));
  } else {
    absl::PrintF("%s on %s (%d test images)\n", a.positional[0], (*ev)->device_name(),
                 result->images);
    absl::PrintF("multipliers: %s\n", rule_text.empty() ? "none (every convolution exact)"
                                                        : absl::StrJoin(rule_text, ", "));
    absl::PrintF("test top-1 %.2f%%, top-5 %.2f%%, loss %.4f\n", 100 * result->top1,
                 100 * result->top5, result->loss);
  }
  return kExitOk;
}

int SensitivityCommand(const Args& a) {
  if (a.positional.size() < 2) {
    return Fail(a, absl::InvalidArgumentError(
                       "sensitivity needs a checkpoint and at least one multiplier"));
  }
  const double budget = a.budget.value_or(1.0);
  if (!(budget >= 0 && budget <= 100)) {
    return Fail(a, absl::InvalidArgumentError("--budget: must be in [0, 100] points"));
  }
  auto device = DeviceFlag(a);
  if (!device.ok()) return Fail(a, device.status());
  auto ev = CheckpointEvaluator::Open(a.positional[0], EvaluatorFlags(a, *device));
  if (!ev.ok()) return Fail(a, ev.status());
  topiary::v1::ApproximationSpec base = (*ev)->spec().approximation();
  if (auto st = ApplyWeightFlags(a.weight_code, a.weight_scales, &base); !st.ok())
    return Fail(a, st);
  const std::vector<std::string> names(a.positional.begin() + 1, a.positional.end());
  auto r = Sensitivity(**ev, names, budget, base, TerminalProgress("evaluating"));
  if (!r.ok()) return Fail(a, r.status());
  WarnFarCodeUseByMultiplier(*r, base);
  if (a.json) {
    std::vector<std::string> mults, rows, assignment;
    for (const Multiplier& m : r->multipliers) {
      mults.push_back(absl::StrFormat(R"({"name":%s,"sha256":"%s","power_mw":%s})",
                                      JsonString(m.name), m.sha256, PowerJson(m)));
    }
    for (const auto& row : r->rows) {
      std::vector<std::string> t;
      for (double v : row.top1) t.push_back(absl::StrFormat("%.6g", v));
      rows.push_back(absl::StrFormat(R"({"layer":%s,"macs":%d,"top1":[%s],"code_use":%s})",
                                     JsonString(row.layer.name), row.layer.macs,
                                     absl::StrJoin(t, ","), CodeUseJson(row.code_use)));
    }
    for (const auto& [layer, m] : r->assignment) {
      assignment.push_back(absl::StrFormat(R"({"layer":%s,"multiplier":%s})", JsonString(layer),
                                           JsonString(names[m])));
    }
    absl::PrintF(
        R"({"checkpoint":%s,"device":%s,"float_top1":%.6g,"weight_code":"%s","weight_scales":"%s",)"
        R"("multipliers":[%s],"layers":[%s],)"
        R"("greedy":{"budget_pts":%g,"top1":%.6g,"relative_power":%.6g,"assignment":[%s],)"
        R"("unknown_power":[%s]}})"
        "\n",
        JsonString(a.positional[0]), JsonString((*ev)->device_name()), r->float_top1,
        WeightCodeName(base), base.per_channel_weights() ? "per_channel" : "per_tensor",
        absl::StrJoin(mults, ","), absl::StrJoin(rows, ","), r->budget_pts, r->assigned_top1,
        r->relative_power, absl::StrJoin(assignment, ","),
        absl::StrJoin(r->unknown_power, ",",
                      [](std::string* out, const std::string& s) { out->append(JsonString(s)); }));
    return kExitOk;
  }
  absl::PrintF("%s on %s: test top-1 %.2f%% with every convolution exact\n", a.positional[0],
               (*ev)->device_name(), r->float_top1);
  absl::PrintF("weights: %s codes, %s scales\n\n", WeightCodeName(base),
               base.per_channel_weights() ? "per-channel" : "per-tensor");
  absl::PrintF("test top-1 (%%) with one layer approximate\n%-30s %12s", "layer", "MACs/image");
  for (const Multiplier& m : r->multipliers) absl::PrintF(" %14.14s", OneLine(m.name));
  absl::PrintF("\n");
  for (const auto& row : r->rows) {
    absl::PrintF("%-30s %12d", row.layer.name, row.layer.macs);
    for (double v : row.top1) absl::PrintF(" %14.2f", v);
    absl::PrintF("\n");
  }
  absl::PrintF(
      "\ngreedy assignment within %.2f points: test top-1 %.2f%%, multiplier power "
      "%.1f%% of exact\n",
      r->budget_pts, r->assigned_top1, 100 * r->relative_power);
  for (const auto& [layer, m] : r->assignment) absl::PrintF("  %-30s %s\n", layer, names[m]);
  if (r->assignment.empty()) absl::PrintF("  (every layer stays exact)\n");
  if (!r->unknown_power.empty()) {
    absl::PrintF("not assigned (power unknown): %s\n", absl::StrJoin(r->unknown_power, ", "));
  }
  return kExitOk;
}

}  // namespace topiary
