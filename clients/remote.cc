#include "clients/remote.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "clients/compare.h"
#include "clients/connection.h"
#include "clients/file_commands.h"
#include "clients/progress.h"
#include "clients/report_print.h"
#include "clients/text.h"
#include "topiary/v1/service.grpc.pb.h"
#include "trainer/run/events.h"
#include "trainer/spec/describe.h"
#include "trainer/spec/spec.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

using topiary::v1::Experiment;

std::string Percent(double x) { return absl::StrFormat("%.2f%%", 100 * x); }
// A test top-1 of 0 is one never measured (chance level is far above it): "-".
std::string Top1(double x) { return x == 0 ? "-" : Percent(x); }

void PrintExperiment(Experiment e) {
  MakePrintable(&e);
  absl::PrintF("%s  %s  %s\n", e.id(), OneLine(e.name()),
               topiary::v1::ExperimentState_Name(e.state()));
  // No model.arch: the network of the checkpoint the experiment starts from.
  const std::string model = e.spec().model().arch().empty()
                                ? "from " + e.spec().init_from_checkpoint()
                                : e.spec().model().arch();
  absl::PrintF("  model %s, device %s\n", model, e.device().empty() ? "-" : e.device());
  absl::PrintF("  round %d, epoch %d, test top-1 %s, sparsity %.1f%%\n", e.round(), e.epoch(),
               Top1(e.test_top1()), 100 * e.sparsity());
  absl::PrintF("  created %s, updated %s\n", e.created_at(), e.updated_at());
  absl::PrintF("  folder %s (in the daemon's data directory)\n", e.folder());
  if (!e.last_checkpoint().empty()) absl::PrintF("  last checkpoint %s\n", e.last_checkpoint());
  if (!e.parent().empty()) absl::PrintF("  forked from %s\n", e.parent());
  if (!e.error().empty()) absl::PrintF("  error: %s\n", e.error());
}

int PrintOrJson(const Args& a, const Experiment& e, const std::string& verb) {
  if (a.json) {
    absl::PrintF("%s\n", ScriptJson(e));
    return kExitOk;
  }
  // Requests a run carries out at its next step boundary: say what happens, not only the
  // state it is still in.
  const auto state = e.state();
  const std::string name = topiary::v1::ExperimentState_Name(state);
  const bool under_way = state == topiary::v1::RUNNING || state == topiary::v1::QUEUED ||
                         state == topiary::v1::WAITING_FOR_ROUND;
  if (verb == "paused" && under_way) {
    absl::PrintF(
        "pause requested for %s (%s): it checkpoints at its next step and becomes "
        "PAUSED; `topiary watch %s` follows it\n",
        e.id(), name, e.id());
  } else if (verb == "cancelled" && under_way) {
    absl::PrintF(
        "cancel requested for %s (%s): it stops at its next step and becomes "
        "CANCELLED\n",
        e.id(), name);
  } else if (verb == "finishing") {
    absl::PrintF("finishing %s: no more rounds; it ends after the round it has done\n", e.id());
  } else if (verb == "advanced") {
    absl::PrintF("advanced %s: the next round starts now; `topiary watch %s` follows it\n", e.id(),
                 e.id());
  } else {
    absl::PrintF("%s %s (%s)\n", verb, e.id(), name);
  }
  return kExitOk;
}

bool NeedsId(const Args& a, const char* what) {
  if (a.positional.size() == 1) return true;
  absl::FPrintF(stderr, "topiary: %s needs exactly one experiment id\n", what);
  return false;
}

// Streams an experiment's events until it ends; the exit code follows its final state.
int Watch(const Args& a, Connection& c, const std::string& id, uint32_t from) {
  ProgressPrinter printer(stderr, isatty(STDERR_FILENO) != 0);
  topiary::v1::WatchExperimentRequest req;
  req.set_id(id);
  req.set_from_seq(from);
  auto ctx = c.Context(/*stream=*/true);
  auto reader = c.stub().WatchExperiment(ctx.get(), req);
  topiary::v1::Event e;
  while (reader->Read(&e)) {
    if (a.json) {
      absl::PrintF("%s\n", EventToJsonLine(e));
      std::fflush(stdout);
    } else {
      printer.Print(e);
    }
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return Report(a, c, st);
  topiary::v1::ExperimentRef ref;
  ref.set_id(id);
  Experiment final_state;
  auto ctx2 = c.Context();
  st = c.stub().GetExperiment(ctx2.get(), ref, &final_state);
  if (!st.ok()) return Report(a, c, st);
  if (!a.json) {
    absl::FPrintF(stderr, "%s: %s\n", id, topiary::v1::ExperimentState_Name(final_state.state()));
  }
  return final_state.state() == topiary::v1::SUCCEEDED ? kExitOk : kExitFailed;
}

int Submit(const Args& a, Connection& c) {
  if (a.positional.size() != 1) {
    absl::FPrintF(stderr, "topiary: submit needs exactly one SPEC file\n");
    return kExitUsage;
  }
  auto spec = LoadSpecFile(a.positional[0]);
  if (!spec.ok()) {
    absl::FPrintF(stderr, "topiary: %s: %s\n", absl::StatusCodeToString(spec.status().code()),
                  TerminalText(spec.status().message()));
    return ExitCodeForStatus(static_cast<int>(spec.status().code()));
  }
  topiary::v1::SubmitExperimentRequest req;
  *req.mutable_spec() = *spec;
  Experiment e;
  auto ctx = c.Context();
  const grpc::Status st = c.stub().SubmitExperiment(ctx.get(), req, &e);
  if (!st.ok()) return Report(a, c, st);
  if (!a.watch) return PrintOrJson(a, e, "submitted");
  if (!a.json)
    absl::FPrintF(stderr, "submitted %s; watching (Ctrl-C stops watching, not the experiment)\n",
                  e.id());
  return Watch(a, c, e.id(), 0);
}

int List(const Args& a, Connection& c) {
  topiary::v1::ListExperimentsRequest req;
  if (!a.state.empty()) {
    topiary::v1::ExperimentState s;
    if (!topiary::v1::ExperimentState_Parse(absl::AsciiStrToUpper(a.state), &s)) {
      absl::FPrintF(stderr,
                    "topiary: --state: one of QUEUED, RUNNING, PAUSED, "
                    "WAITING_FOR_ROUND, SUCCEEDED, FAILED, CANCELLED\n");
      return kExitUsage;
    }
    req.set_state(s);
  }
  topiary::v1::ListExperimentsResponse resp;  // every page, merged
  do {
    topiary::v1::ListExperimentsResponse page;
    auto ctx = c.Context();
    const grpc::Status st = c.stub().ListExperiments(ctx.get(), req, &page);
    if (!st.ok()) return Report(a, c, st);
    for (auto& e : *page.mutable_experiments()) *resp.add_experiments() = std::move(e);
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  if (a.json) {
    absl::PrintF("%s\n", ScriptJson(resp));
    return kExitOk;
  }
  MakePrintable(&resp);
  absl::PrintF("%-9s %-24s %-17s %5s %5s %9s %8s  %-12s %-8s %-12s %-18s %s\n", "id", "name",
               "state", "round", "epoch", "top-1", "sparsity", "method", "target", "multiplier",
               "parent", "updated");
  for (const auto& e : resp.experiments()) {
    absl::PrintF("%-9s %-24s %-17s %5d %5d %9s %7.1f%%  %-12s %-8s %-12s %-18s %s\n", e.id(),
                 OneLine(e.name()), topiary::v1::ExperimentState_Name(e.state()), e.round(),
                 e.epoch(), Top1(e.test_top1()), 100 * e.sparsity(), DescribeMethod(e.spec()),
                 DescribeTarget(e.spec()), DescribeMultiplier(e.spec()), DescribeParent(e.parent()),
                 e.updated_at());
  }
  return kExitOk;
}

int WatchCommand(const Args& a, Connection& c) {
  if (!NeedsId(a, "watch")) return kExitUsage;
  return Watch(a, c, a.positional[0], a.from.value_or(0));
}

int Lifecycle(const Args& a, Connection& c) {
  const std::string& cmd = a.command;
  grpc::Status st;
  if (!NeedsId(a, cmd.c_str())) return kExitUsage;
  topiary::v1::ExperimentRef ref;
  ref.set_id(a.positional[0]);
  Experiment e;
  auto ctx = c.Context();
  if (cmd == "get") st = c.stub().GetExperiment(ctx.get(), ref, &e);
  if (cmd == "pause") st = c.stub().PauseExperiment(ctx.get(), ref, &e);
  if (cmd == "resume") st = c.stub().ResumeExperiment(ctx.get(), ref, &e);
  if (cmd == "cancel") st = c.stub().CancelExperiment(ctx.get(), ref, &e);
  if (!st.ok()) return Report(a, c, st);
  if (cmd == "get" && !a.json) {
    PrintExperiment(e);
    return kExitOk;
  }
  return PrintOrJson(a, e, cmd == "get" ? "" : absl::StrCat(cmd, cmd == "cancel" ? "led" : "d"));
}

int Round(const Args& a, Connection& c) {
  if (!NeedsId(a, "round")) return kExitUsage;
  topiary::v1::AdvanceRoundRequest req;
  req.set_id(a.positional[0]);
  if (a.target) req.set_target(static_cast<float>(*a.target));
  if (a.step) req.set_step_fraction(static_cast<float>(*a.step));
  if (a.epochs) req.set_finetune_epochs(*a.epochs);
  req.set_finish(a.finish);
  Experiment e;
  auto ctx = c.Context();
  const grpc::Status st = c.stub().AdvanceRound(ctx.get(), req, &e);
  if (!st.ok()) return Report(a, c, st);
  return PrintOrJson(a, e, a.finish ? "finishing" : "advanced");
}

int Fork(const Args& a, Connection& c) {
  if (a.positional.size() != 1) {
    absl::FPrintF(stderr, "topiary: fork needs exactly one checkpoint path\n");
    return kExitUsage;
  }
  topiary::v1::ForkExperimentRequest req;
  req.set_checkpoint(a.positional[0]);
  for (const std::string& s : a.sets) req.add_set(s);
  req.set_name(a.name);
  Experiment e;
  auto ctx = c.Context();
  const grpc::Status st = c.stub().ForkExperiment(ctx.get(), req, &e);
  if (!st.ok()) return Report(a, c, st);
  if (!a.watch) return PrintOrJson(a, e, "forked as");
  return Watch(a, c, e.id(), 0);
}

int Multipliers(const Args& a, Connection& c) {
  topiary::v1::ListMultipliersResponse resp;
  auto ctx = c.Context();
  const grpc::Status st =
      c.stub().ListMultipliers(ctx.get(), topiary::v1::ListMultipliersRequest(), &resp);
  if (!st.ok()) return Report(a, c, st);
  PrintMultipliers(a.json, {resp.multipliers().begin(), resp.multipliers().end()});
  if (!a.json) {
    absl::PrintF("generated families (name them in a rule): %s\n",
                 absl::StrJoin(resp.families(), ", "));
  }
  return kExitOk;
}

int Checkpoints(const Args& a, Connection& c) {
  if (!NeedsId(a, "checkpoints")) return kExitUsage;
  topiary::v1::ExperimentRef ref;
  ref.set_id(a.positional[0]);
  topiary::v1::ListCheckpointsResponse resp;
  auto ctx = c.Context();
  const grpc::Status st = c.stub().ListCheckpoints(ctx.get(), ref, &resp);
  if (!st.ok()) return Report(a, c, st);
  if (a.json) {
    absl::PrintF("%s\n", ScriptJson(resp));
    return kExitOk;
  }
  MakePrintable(&resp);
  absl::PrintF("%-52s %5s %5s %10s %9s  %s\n", "path", "round", "epoch", "bytes", "top-1",
               "written");
  for (const auto& k : resp.checkpoints()) {
    absl::PrintF("%-52s %5d %5d %10d %9s  %s\n", k.path(), k.round(), k.epoch(), k.bytes(),
                 Percent(k.test_top1()), k.created_at());
  }
  return kExitOk;
}

int InspectRemote(const Args& a, Connection& c) {
  if (a.positional.size() != 1) {
    absl::FPrintF(stderr,
                  "topiary: inspect --remote needs a checkpoint path in the data directory\n");
    return kExitUsage;
  }
  topiary::v1::InspectCheckpointRequest req;
  req.set_path(a.positional[0]);
  req.set_layer(a.layer);
  topiary::v1::CheckpointReport report;
  auto ctx = c.Context();
  const grpc::Status st = c.stub().InspectCheckpoint(ctx.get(), req, &report);
  if (!st.ok()) return Report(a, c, st);
  PrintCheckpointReport(report, a.json);
  return kExitOk;
}

int ImportRemote(const Args& a, Connection& c) {
  if (a.positional.size() != 1 || a.out.empty()) {
    absl::FPrintF(stderr,
                  "topiary: import --remote needs MODEL.onnx and --out CKPT.h5, both paths in "
                  "the daemon's data directory\n");
    return kExitUsage;
  }
  topiary::v1::ImportModelRequest req;
  req.set_onnx_path(a.positional[0]);
  req.set_out_path(a.out);
  req.set_arch(a.arch);
  req.set_data(a.data);
  if (a.max_value) req.set_max_value(static_cast<float>(*a.max_value));
  const auto mean = ParseFloats(a.mean, "mean");
  const auto std = ParseFloats(a.std, "std");
  int h = 0, w = 0, ch = 0;
  if (!mean.ok() || !std.ok() || (!a.input.empty() && !ParseImageSize(a.input, &h, &w, &ch))) {
    absl::FPrintF(stderr, "topiary: --mean/--std take numbers, --input HxWxC\n");
    return kExitUsage;
  }
  req.mutable_mean()->Add(mean->begin(), mean->end());
  req.mutable_std()->Add(std->begin(), std->end());
  req.set_height(h);
  req.set_width(w);
  req.set_channels(ch);
  topiary::v1::ImportSummary summary;
  auto ctx = c.Context();
  const grpc::Status st = c.stub().ImportModel(ctx.get(), req, &summary);
  if (!st.ok()) return Report(a, c, st);
  PrintImportSummary(summary, a.json);
  return kExitOk;
}

using Command = int (*)(const Args&, Connection&);

const std::map<std::string, Command>& Commands() {
  static const auto* commands = new std::map<std::string, Command>{
      {"submit", Submit},
      {"list", List},
      {"watch", WatchCommand},
      {"get", Lifecycle},
      {"pause", Lifecycle},
      {"resume", Lifecycle},
      {"cancel", Lifecycle},
      {"round", Round},
      {"fork", Fork},
      {"multipliers", Multipliers},
      {"checkpoints", Checkpoints},
      {"inspect", InspectRemote},
      {"import", ImportRemote},
      {"upload", UploadCommand},
      {"download", DownloadCommand},
      {"files", FilesCommand},
      {"compare", CompareCommand},
  };
  return *commands;
}

}  // namespace

bool IsRemoteCommand(const std::string& c) { return Commands().count(c) > 0; }

int RunRemoteCommand(const Args& a) {
  Connection c(a);
  if (!c.token_error().empty()) {
    absl::FPrintF(stderr, "topiary: %s\n", c.token_error());
    return kExitUsage;
  }
  const auto it = Commands().find(a.command);
  if (it == Commands().end()) {
    absl::FPrintF(stderr, "topiary: unknown command '%s'\n", a.command);
    return kExitUsage;
  }
  return it->second(a, c);
}

int RunInDaemon(const Args& a) {
  Connection c(a);
  if (!c.token_error().empty()) {
    absl::FPrintF(stderr, "topiary: %s\n", c.token_error());
    return kExitUsage;
  }
  // The arguments as given, less what is this client's: --remote and the connection flags.
  topiary::v1::RunCommandRequest req;
  req.set_command(a.command);
  const std::vector<std::string> own = {"remote", "server", "token_file", "tls_ca"};
  for (size_t i = 0; i < a.raw.size(); ++i) {
    const std::string& arg = a.raw[i];
    const std::string name = absl::StartsWith(arg, "--") ? arg.substr(2, arg.find('=') - 2) : "";
    if (std::find(own.begin(), own.end(), name) != own.end()) {
      if (name != "remote" && arg.find('=') == std::string::npos) ++i;  // and its value
      continue;
    }
    req.add_args(arg);
  }
  auto ctx = c.Context(/*stream=*/true);
  auto reader = c.stub().RunCommand(ctx.get(), req);
  topiary::v1::CommandOutput out;
  int code = kExitFailed;
  while (reader->Read(&out)) {
    std::fwrite(out.out().data(), 1, out.out().size(), stdout);
    std::fwrite(out.err().data(), 1, out.err().size(), stderr);
    std::fflush(stdout);
    if (out.exited()) code = out.exit_code();
  }
  const grpc::Status st = reader->Finish();
  if (!st.ok()) return Report(a, c, st);
  return code;
}

std::optional<topiary::v1::ServerInfo> FetchRemoteInfo(const Args& a, std::string* why) {
  Connection c(a);
  topiary::v1::ServerInfo info;
  auto ctx = c.Context();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  const grpc::Status st =
      c.stub().GetServerInfo(ctx.get(), topiary::v1::GetServerInfoRequest(), &info);
  if (!st.ok()) {
    *why = absl::StrFormat("none answering at %s (%s)", c.address(), CodeName(st.error_code()));
    return std::nullopt;
  }
  return info;
}

void PrintRemoteInfo(const Args& a) {
  std::string why;
  auto info = FetchRemoteInfo(a, &why);
  if (info) MakePrintable(&*info);
  if (!info) {
    absl::PrintF("daemon: %s\n", why);
    return;
  }
  absl::PrintF("daemon at %s: topiaryd %s, %d running / %d slot(s), %d queued, devices: %s\n",
               Connection(a).address(), info->version(), info->running(), info->max_running(),
               info->queued(), absl::StrJoin(info->devices(), ", "));
  for (const topiary::v1::GpuSlot& g : info->gpus()) {
    absl::PrintF("  GPU %d %s: %s\n", g.ordinal(), g.name(),
                 g.experiment().empty()
                     ? std::string("free")
                     : absl::StrFormat("%s (%s)", g.experiment(), g.experiment_name()));
  }
}

}  // namespace topiary
