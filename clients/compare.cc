#include "clients/compare.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/progress.h"
#include "clients/text.h"
#include "trainer/spec/describe.h"
#include "trainer/util/png_canvas.h"

namespace topiary {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using topiary::v1::Experiment;
using topiary::v1::ExperimentSpec;
using topiary::v1::RoundSummary;
using topiary::v1::RunSummary;

// One experiment as compared: its record, its rounds and summary (from its event log) and
// its multiplier's power where that is a known circuit.
struct Compared {
  Experiment e;
  std::vector<RoundSummary> rounds;
  std::optional<RunSummary> summary;
  std::optional<double> power_mw;
};

// The spec as "field.path" -> value (text format), every field that is set.
void Flatten(const Message& m, const std::string& prefix, std::map<std::string, std::string>* out) {
  std::vector<const FieldDescriptor*> fields;
  m.GetReflection()->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string name = prefix + f->name();
    const int n = f->is_repeated() ? m.GetReflection()->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string at = f->is_repeated() ? absl::StrCat(name, "[", i, "]") : name;
      if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
        const Message& sub = f->is_repeated() ? m.GetReflection()->GetRepeatedMessage(m, f, i)
                                              : m.GetReflection()->GetMessage(m, f);
        Flatten(sub, at + ".", out);
        continue;
      }
      std::string value;
      google::protobuf::TextFormat::PrintFieldValueToString(m, f, f->is_repeated() ? i : -1,
                                                            &value);
      (*out)[at] = value;
    }
  }
}

// What `id`'s event log holds: its rounds and its last summary. The stream is left as soon as
// the newest event the record names has arrived (a running experiment's log goes on).
grpc::Status ReadEvents(Connection& c, const Experiment& e, Compared* out) {
  if (e.last_seq() == 0) return grpc::Status::OK;
  topiary::v1::WatchExperimentRequest req;
  req.set_id(e.id());
  auto ctx = c.Context(/*stream=*/true);
  auto reader = c.stub().WatchExperiment(ctx.get(), req);
  topiary::v1::Event ev;
  while (reader->Read(&ev)) {
    if (ev.has_round()) out->rounds.push_back(ev.round());
    if (ev.has_summary()) out->summary = ev.summary();
    if (ev.seq() >= e.last_seq()) {
      ctx->TryCancel();
      break;
    }
  }
  const grpc::Status st = reader->Finish();
  // A finished run's summary holds every round, round 0 (the dense network) included.
  if (out->summary && out->summary->rounds_size() > 0) {
    out->rounds.assign(out->summary->rounds().begin(), out->summary->rounds().end());
  }
  return st.error_code() == grpc::StatusCode::CANCELLED ? grpc::Status::OK : st;
}

std::string Pct(double x) { return absl::StrFormat("%.2f%%", 100 * x); }

// The last round's multiply-adds as a share of the first (the dense network's); -1 unknown.
double MacsShare(const Compared& x) {
  if (x.rounds.size() < 2 || x.rounds.front().multiply_adds() <= 0) return -1;
  return static_cast<double>(x.rounds.back().multiply_adds()) / x.rounds.front().multiply_adds();
}

std::vector<std::pair<std::string, std::vector<std::string>>> ResultRows(
    const std::vector<Compared>& xs) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto row = [&](const std::string& label, auto value) {
    std::vector<std::string> v;
    for (const Compared& x : xs) v.push_back(value(x));
    rows.emplace_back(label, std::move(v));
  };
  row("name", [](const Compared& x) { return OneLine(x.e.name()); });
  row("state", [](const Compared& x) { return topiary::v1::ExperimentState_Name(x.e.state()); });
  row("method", [](const Compared& x) { return DescribeMethod(x.e.spec()); });
  row("target", [](const Compared& x) { return DescribeTarget(x.e.spec()); });
  row("multiplier", [](const Compared& x) {
    return DescribeMultiplier(x.e.spec()) +
           (x.power_mw ? absl::StrFormat(" (%.3f mW)", *x.power_mw) : std::string());
  });
  row("weight code", [](const Compared& x) {
    return x.e.spec().has_approximation() ? topiary::v1::ApproximationSpec::WeightCode_Name(
                                                x.e.spec().approximation().weight_code())
                                          : std::string("-");
  });
  row("parent", [](const Compared& x) { return DescribeParent(x.e.parent()); });
  row("test top-1", [](const Compared& x) {
    return x.e.test_top1() > 0 ? Pct(x.e.test_top1()) : std::string("-");
  });
  row("val top-1", [](const Compared& x) {
    return x.e.val_top1() > 0 ? Pct(x.e.val_top1()) : std::string("-");
  });
  row("dense top-1", [](const Compared& x) {
    return x.summary && x.summary->dense_top1() > 0 ? Pct(x.summary->dense_top1())
                                                    : std::string("-");
  });
  row("sparsity",
      [](const Compared& x) { return absl::StrFormat("%.1f%%", 100 * x.e.sparsity()); });
  row("mult-adds", [](const Compared& x) {
    return MacsShare(x) < 0 ? std::string("-")
                            : absl::StrFormat("%.1f%% of round 0", 100 * MacsShare(x));
  });
  row("step time", [](const Compared& x) {
    return x.rounds.empty() || x.rounds.back().step_seconds() <= 0
               ? std::string("-")
               : absl::StrFormat("%.2f ms", 1e3 * x.rounds.back().step_seconds());
  });
  row("test energy", [](const Compared& x) {
    return x.summary && x.summary->test_joules_per_image() > 0
               ? absl::StrFormat("%.3f mJ/image", 1e3 * x.summary->test_joules_per_image())
               : std::string("-");
  });
  row("rounds", [](const Compared& x) {
    return std::to_string(x.rounds.empty() ? 0 : x.rounds.back().round());
  });
  return rows;
}

std::vector<std::pair<std::string, std::vector<std::string>>> SpecDifferences(
    const std::vector<Compared>& xs) {
  std::vector<std::map<std::string, std::string>> flat(xs.size());
  std::set<std::string> keys;
  for (size_t i = 0; i < xs.size(); ++i) {
    Flatten(xs[i].e.spec(), "", &flat[i]);
    for (const auto& [k, v] : flat[i]) keys.insert(k);
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const std::string& k : keys) {
    if (k == "name") continue;  // shown above
    std::vector<std::string> values;
    for (const auto& f : flat) values.push_back(f.count(k) ? f.at(k) : "-");
    if (std::adjacent_find(values.begin(), values.end(), std::not_equal_to<>()) != values.end()) {
      out.emplace_back(k, std::move(values));
    }
  }
  return out;
}

void PrintTable(const std::vector<std::string>& head,
                const std::vector<std::pair<std::string, std::vector<std::string>>>& rows) {
  size_t label_w = 12;
  std::vector<size_t> w(head.size(), 0);
  for (size_t i = 0; i < head.size(); ++i) w[i] = head[i].size();
  for (const auto& [label, values] : rows) {
    label_w = std::max(label_w, label.size());
    for (size_t i = 0; i < values.size(); ++i) w[i] = std::max(w[i], values[i].size());
  }
  absl::PrintF("%-*s", label_w, "");
  for (size_t i = 0; i < head.size(); ++i) absl::PrintF("  %-*s", w[i], head[i]);
  absl::PrintF("\n");
  for (const auto& [label, values] : rows) {
    absl::PrintF("%-*s", label_w, label);
    for (size_t i = 0; i < values.size(); ++i) absl::PrintF("  %-*s", w[i], values[i]);
    absl::PrintF("\n");
  }
}

std::string RoundsJson(const Compared& x) {
  std::vector<std::string> rs;
  for (const RoundSummary& r : x.rounds) {
    rs.push_back(absl::StrFormat(
        R"({"round":%d,"sparsity":%.6g,"test_top1":%.6g,"val_top1":%.6g,"multiply_adds":%d,)"
        R"("step_seconds":%.6g})",
        r.round(), r.sparsity(), r.test_top1(), r.val_top1(), r.multiply_adds(), r.step_seconds()));
  }
  return absl::StrCat("[", absl::StrJoin(rs, ","), "]");
}

void PrintJson(const std::vector<Compared>& xs,
               const std::vector<std::pair<std::string, std::vector<std::string>>>& diffs) {
  std::vector<std::string> items;
  for (const Compared& x : xs) {
    const ExperimentSpec& s = x.e.spec();
    items.push_back(absl::StrFormat(
        R"({"id":%s,"name":%s,"state":"%s","method":%s,"target":%s,"multiplier":%s,)"
        R"("power_mw":%s,"parent":%s,"test_top1":%.6g,"val_top1":%.6g,"dense_top1":%.6g,)"
        R"("sparsity":%.6g,)"
        R"("multiply_adds_share":%s,"step_seconds":%.6g,"test_joules_per_image":%.6g,"rounds":%s})",
        JsonString(x.e.id()), JsonString(x.e.name()),
        topiary::v1::ExperimentState_Name(x.e.state()), JsonString(DescribeMethod(s)),
        JsonString(DescribeTarget(s)), JsonString(DescribeMultiplier(s)),
        x.power_mw ? absl::StrFormat("%.6g", *x.power_mw) : "null", JsonString(x.e.parent()),
        x.e.test_top1(), x.e.val_top1(), x.summary ? x.summary->dense_top1() : 0.0, x.e.sparsity(),
        MacsShare(x) < 0 ? "null" : absl::StrFormat("%.6g", MacsShare(x)),
        x.rounds.empty() ? 0.0 : x.rounds.back().step_seconds(),
        x.summary ? x.summary->test_joules_per_image() : 0.0, RoundsJson(x)));
  }
  std::vector<std::string> d;
  for (const auto& [field, values] : diffs) {
    std::vector<std::string> v;
    for (const std::string& s : values) v.push_back(JsonString(s));
    d.push_back(
        absl::StrFormat(R"({"field":%s,"values":[%s]})", JsonString(field), absl::StrJoin(v, ",")));
  }
  absl::PrintF("{\"experiments\":[%s],\"spec_differences\":[%s]}\n", absl::StrJoin(items, ","),
               absl::StrJoin(d, ","));
}

// Held-out top-1 (%: validation where a run holds it out, else test) against sparsity or
// multiply-adds (% of round 0), one curve per experiment through its rounds, with a legend of ids.
std::string CurvesPng(const std::vector<Compared>& xs, bool macs) {
  constexpr int kW = 720, kH = 480, kLeft = 64, kRight = 180, kTop = 32, kBottom = 56;
  const Rgb kColours[] = {{31, 119, 180}, {214, 39, 40}, {44, 160, 44},   {148, 103, 189},
                          {255, 127, 14}, {140, 86, 75}, {227, 119, 194}, {23, 190, 207}};
  std::vector<std::vector<std::pair<double, double>>> curves;
  double ylo = 100, yhi = 0;
  for (const Compared& x : xs) {
    std::vector<std::pair<double, double>> pts;
    for (const RoundSummary& r : x.rounds) {
      const double base = x.rounds.front().multiply_adds();
      const double px =
          macs ? (base > 0 ? 100.0 * r.multiply_adds() / base : 100.0) : 100.0 * r.sparsity();
      const double top1 = 100.0 * HeldOutOf(r).top1;
      pts.push_back({px, top1});
      ylo = std::min(ylo, top1);
      yhi = std::max(yhi, top1);
    }
    curves.push_back(std::move(pts));
  }
  if (yhi <= ylo) {
    ylo = std::max(0.0, ylo - 1);
    yhi = std::min(100.0, yhi + 1);
  }
  ylo = std::floor(ylo);
  yhi = std::ceil(yhi);
  Canvas c(kW, kH);
  const int pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double v) { return kLeft + static_cast<int>(std::lround(v / 100.0 * pw)); };
  auto Y = [&](double v) {
    return kTop + ph - static_cast<int>(std::lround((v - ylo) / (yhi - ylo) * ph));
  };
  const Rgb grey{200, 200, 200}, black{0, 0, 0};
  for (int i = 0; i <= 5; ++i) {  // grid and ticks
    const double xv = 20.0 * i, yv = ylo + (yhi - ylo) * i / 5;
    c.Line(X(xv), kTop, X(xv), kTop + ph, grey);
    c.Line(kLeft, Y(yv), kLeft + pw, Y(yv), grey);
    const std::string xl = absl::StrFormat("%.0f", xv), yl = absl::StrFormat("%.1f", yv);
    c.Text(X(xv) - 4 * static_cast<int>(xl.size()), kTop + ph + 8, xl);
    c.Text(kLeft - 8 - 8 * static_cast<int>(yl.size()), Y(yv) - 5, yl);
  }
  c.Line(kLeft, kTop + ph, kLeft + pw, kTop + ph, black, 2);
  c.Line(kLeft, kTop, kLeft, kTop + ph, black, 2);
  const std::string xlabel = macs ? "MULT-ADDS % OF ROUND 0" : "SPARSITY %";
  c.Text(kLeft + pw / 2 - 4 * static_cast<int>(xlabel.size()), kH - 24, xlabel);
  // Rounds of runs with a validation set are judged on it (held-out training images).
  const bool val = std::any_of(xs.begin(), xs.end(), [](const Compared& x) {
    return !x.rounds.empty() && x.rounds.back().val_loss() > 0;
  });
  c.Text(8, 10, val ? "HELD-OUT TOP-1 % (VALIDATION WHERE HELD OUT)" : "TEST TOP-1 %");
  for (size_t i = 0; i < curves.size(); ++i) {
    const Rgb col = kColours[i % 8];
    for (size_t j = 0; j < curves[i].size(); ++j) {
      const int x = X(curves[i][j].first), y = Y(curves[i][j].second);
      c.Fill(x - 3, y - 3, 7, 7, col);
      if (j > 0) c.Line(X(curves[i][j - 1].first), Y(curves[i][j - 1].second), x, y, col, 2);
    }
    const int ly = kTop + 8 + 20 * static_cast<int>(i);
    c.Fill(kLeft + pw + 16, ly, 16, 10, col);
    c.Text(kLeft + pw + 40, ly, xs[i].e.id());
  }
  return c.Png();
}

}  // namespace

int CompareCommand(const Args& a, Connection& c) {
  if (a.positional.size() < 2) {
    absl::FPrintF(stderr, "topiary: compare needs at least two experiment ids\n");
    return kExitUsage;
  }
  if (!a.axis.empty() && a.axis != "sparsity" && a.axis != "macs") {
    return Fail(a,
                absl::InvalidArgumentError("--axis: 'sparsity' or 'macs', not '" + a.axis + "'"));
  }
  // Known circuits' power, by the name a rule's table file has in the library.
  std::map<std::string, double> power;
  {
    topiary::v1::ListMultipliersResponse resp;
    auto ctx = c.Context();
    if (c.stub().ListMultipliers(ctx.get(), {}, &resp).ok()) {
      for (const auto& m : resp.multipliers()) {
        if (m.has_power_mw()) power[m.name()] = m.power_mw();
      }
    }
  }
  std::vector<Compared> xs;
  for (const std::string& id : a.positional) {
    Compared x;
    topiary::v1::ExperimentRef ref;
    ref.set_id(id);
    auto ctx = c.Context();
    if (grpc::Status st = c.stub().GetExperiment(ctx.get(), ref, &x.e); !st.ok()) {
      return Report(a, c, st);
    }
    if (grpc::Status st = ReadEvents(c, x.e, &x); !st.ok()) return Report(a, c, st);
    const std::string m = DescribeMultiplier(x.e.spec());
    if (power.count(m)) x.power_mw = power[m];
    xs.push_back(std::move(x));
  }
  const auto diffs = SpecDifferences(xs);
  if (!a.png.empty()) {
    std::ofstream out(a.png, std::ios::binary);
    out << CurvesPng(xs, a.axis == "macs");
    if (!out) return Fail(a, absl::PermissionDeniedError(a.png + ": cannot be written"));
  }
  if (a.json) {
    PrintJson(xs, diffs);
    return kExitOk;
  }
  for (Compared& x : xs) MakePrintable(&x.e);
  std::vector<std::string> head;
  for (const Compared& x : xs) head.push_back(x.e.id());
  PrintTable(head, ResultRows(xs));
  if (!diffs.empty()) {
    absl::PrintF("\nspec differences\n");
    PrintTable(head, diffs);
  }
  // Per round: held-out top-1 (sparsity, multiply-adds of round 0).
  size_t most = 0;
  for (const Compared& x : xs) most = std::max(most, x.rounds.size());
  if (most > 0) {
    absl::PrintF(
        "\nper round: top-1 on the test set, or 'val' on the validation set where held out "
        "(sparsity, mult-adds of round 0)\n");
    std::vector<std::pair<std::string, std::vector<std::string>>> rows;
    for (size_t r = 0; r < most; ++r) {
      std::vector<std::string> v;
      for (const Compared& x : xs) {
        if (r >= x.rounds.size()) {
          v.push_back("");
          continue;
        }
        const RoundSummary& k = x.rounds[r];
        const double base = x.rounds.front().multiply_adds();
        const HeldOut h = HeldOutOf(k);
        v.push_back(absl::StrFormat(
            "%s%.2f%% (%.1f%%, %s)", h.set == std::string("val") ? "val " : "", 100 * h.top1,
            100 * k.sparsity(),
            base > 0 ? absl::StrFormat("%.0f%%", 100 * k.multiply_adds() / base) : "-"));
      }
      rows.emplace_back(absl::StrCat("round ", r), std::move(v));
    }
    PrintTable(head, rows);
  }
  if (!a.png.empty()) absl::PrintF("\nwrote %s\n", a.png);
  return kExitOk;
}

}  // namespace topiary
