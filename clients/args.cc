#include "clients/args.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/text.h"

ABSL_FLAG(std::string, out, "",
          "run: write the run's files (spec, events, summary, checkpoints) here");
ABSL_FLAG(std::string, resume, "", "run: continue an interrupted run from this checkpoint");
ABSL_FLAG(std::string, file, "", "inspect: a local checkpoint file (the same as naming it)");
ABSL_FLAG(bool, remote, false,
          "inspect, import, evaluate, sensitivity, export: the paths are in the daemon's data "
          "directory and the daemon does the work");
ABSL_FLAG(std::string, layer, "", "inspect: a heat map of the one layer matching this glob");
ABSL_FLAG(std::string, server, "",
          "topiaryd's address (default $TOPIARY_SERVER or 127.0.0.1:7077)");
ABSL_FLAG(std::string, token_file, "",
          "a file holding the bearer token (default $TOPIARY_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "", "connect with TLS, trusting this CA certificate (PEM)");
ABSL_FLAG(std::string, state, "", "list: only experiments in this state (e.g. RUNNING)");
ABSL_FLAG(std::string, name, "", "fork: the new experiment's name");
ABSL_FLAG(std::optional<uint32_t>, from, std::nullopt,
          "watch: start at this event sequence number");
ABSL_FLAG(std::optional<double>, target, std::nullopt, "round: the sparsity target for this round");
ABSL_FLAG(std::optional<double>, step, std::nullopt, "round: the step fraction for this round");
ABSL_FLAG(std::optional<int>, epochs, std::nullopt, "round: fine-tuning epochs for this round");
// Registered for the help text and the lookup; its values are collected by ParseArgs (Args::sets).
ABSL_FLAG(std::vector<std::string>, set, {},
          "fork: override a spec field, field=value; evaluate: PATTERN=MULTIPLIER (repeatable)");
ABSL_FLAG(std::string, png, "",
          "multipliers: write the one multiplier's error surface here (PNG); compare: the "
          "accuracy curves");
ABSL_FLAG(std::string, axis, "", "compare --png: the x axis, 'sparsity' (default) or 'macs'");
ABSL_FLAG(std::optional<double>, budget, std::nullopt,
          "sensitivity: test top-1 points the greedy assignment may lose (default 1)");
ABSL_FLAG(bool, bench, false,
          "evaluate: inference speed, latency, energy and accuracy with cuDNN and with "
          "block-sparse kernels where they measure faster");
ABSL_FLAG(std::string, batch, "",
          "evaluate --bench: the large batch (256); export: the input's batch, N or 'dynamic' "
          "(1)");
ABSL_FLAG(std::vector<std::string>, multipliers, {},
          "evaluate: every convolution under each of these multipliers in turn (comma-separated), "
          "one row each; with --weight_code a,b, under each code too");
ABSL_FLAG(std::string, baseline, "",
          "evaluate --bench: also measure this checkpoint (e.g. the dense parent of a channel-"
          "pruned one) on the same device, and give the ratios");
ABSL_FLAG(std::string, device, "",
          "evaluate, sensitivity: 'cpu' or 'cuda' instead of the checkpoint's device (BF16 runs "
          "in FP32 on the CPU)");
ABSL_FLAG(std::string, data, "",
          "evaluate, sensitivity: evaluate on this data set instead of the checkpoint's; import: "
          "record it with the network. fashion_mnist, mnist:PATH, cifar10:PATH, cifar100:PATH, "
          "digits:FILE or folder:PATH (an image folder)");
ABSL_FLAG(std::optional<int64_t>, test_limit, std::nullopt,
          "evaluate, sensitivity: only the first N test images");
ABSL_FLAG(std::string, onnx, "", "export: write the ONNX model to this file");
ABSL_FLAG(std::string, batch_norm, "fold",
          "export: 'fold' batch norm into the convolutions or 'keep' BatchNormalization nodes");
ABSL_FLAG(std::string, input, "",
          "import: the image HxWxC where the ONNX input's sizes are symbolic, e.g. 224x224x3");
ABSL_FLAG(std::vector<std::string>, mean, {},
          "import: per-channel mean of the pixels scaled to [0, 1] the model was trained on "
          "(one value, or one per channel, comma-separated)");
ABSL_FLAG(std::vector<std::string>, std, {},
          "import: per-channel std the model was trained with (as --mean)");
ABSL_FLAG(std::optional<double>, max_value, std::nullopt,
          "import: the pixel value of full intensity (default 255)");
ABSL_FLAG(std::string, arch, "", "import: the network's name (default onnx:<file stem>)");
ABSL_FLAG(std::string, weight_code, "",
          "evaluate, sensitivity: the approximation's weight codes, 'asymmetric' (TFApprox's) "
          "or 'sign_magnitude' (default: the checkpoint's own)");
ABSL_FLAG(std::string, weight_scales, "",
          "evaluate, sensitivity: weight quantization 'per_tensor' (one scale per layer) or "
          "'per_channel' (one per output channel) (default: the checkpoint's own)");
ABSL_FLAG(bool, sha256, false, "files: give each file's SHA-256 (the daemon reads every file)");
ABSL_FLAG(std::optional<int>, rank, std::nullopt,
          "worker: this process's global rank (default: Slurm's SLURM_PROCID)");
ABSL_FLAG(std::optional<int>, world, std::nullopt,
          "worker: the processes of the run (default: Slurm's SLURM_NTASKS)");
ABSL_FLAG(std::optional<int>, local_rank, std::nullopt,
          "worker: the rank among this host's processes, which GPU it takes (default: "
          "SLURM_LOCALID, else 0)");
ABSL_FLAG(std::string, rendezvous, "",
          "worker: a fresh directory every process reaches (default under Slurm: "
          "OUT/rendezvous/jobJOB.STEP)");
ABSL_FLAG(std::string, experiment, "",
          "worker: the daemon's experiment id; with --server, rank 0 reports its events there "
          "(topiaryd --scheduler slurm sets both)");
ABSL_FLAG(bool, json, false, "machine-readable output: one JSON object per line");
ABSL_FLAG(bool, watch, false, "submit, fork: follow the new experiment's events");
ABSL_FLAG(bool, finish, false, "round: end the manual rounds here; the run finishes");

namespace topiary {

int Fail(const Args& a, const absl::Status& st) {
  if (a.json) {
    absl::PrintF("{\"error\":%s}\n", JsonString(st.message()));
  } else {
    absl::FPrintF(stderr, "topiary: %s\n", TerminalText(st.message()));
  }
  return ExitCodeForStatus(static_cast<int>(st.code()));
}

int ExitCodeForStatus(int code) {
  switch (code) {
    case 0:  // OK
      return kExitOk;
    case 3:   // INVALID_ARGUMENT
    case 15:  // DATA_LOSS
      return kExitInvalid;
    case 5:  // NOT_FOUND
      return kExitNotFound;
    case 9:  // FAILED_PRECONDITION
      return kExitWrongState;
    case 14:  // UNAVAILABLE
    case 4:   // DEADLINE_EXCEEDED
      return kExitUnavailable;
    case 16:  // UNAUTHENTICATED
    case 7:   // PERMISSION_DENIED
      return kExitDenied;
    case 8:  // RESOURCE_EXHAUSTED
      return kExitResourceLimit;
    default:
      return kExitFailed;
  }
}

namespace {
// The CLI's own flags: those defined in this file (the registry also holds Abseil's).
bool IsCliFlag(const absl::CommandLineFlag& f) { return f.Filename() == __FILE__; }

// The parsed flags' values into `a`.
void CopyFlags(Args* a) {
  a->out = absl::GetFlag(FLAGS_out);
  a->resume = absl::GetFlag(FLAGS_resume);
  a->file = absl::GetFlag(FLAGS_file);
  a->remote = absl::GetFlag(FLAGS_remote);
  a->layer = absl::GetFlag(FLAGS_layer);
  a->server = absl::GetFlag(FLAGS_server);
  a->token_file = absl::GetFlag(FLAGS_token_file);
  a->tls_ca = absl::GetFlag(FLAGS_tls_ca);
  a->state = absl::GetFlag(FLAGS_state);
  a->name = absl::GetFlag(FLAGS_name);
  a->from = absl::GetFlag(FLAGS_from);
  a->target = absl::GetFlag(FLAGS_target);
  a->step = absl::GetFlag(FLAGS_step);
  a->budget = absl::GetFlag(FLAGS_budget);
  a->png = absl::GetFlag(FLAGS_png);
  a->axis = absl::GetFlag(FLAGS_axis);
  a->epochs = absl::GetFlag(FLAGS_epochs);
  a->json = absl::GetFlag(FLAGS_json);
  a->sha256 = absl::GetFlag(FLAGS_sha256);
  a->bench = absl::GetFlag(FLAGS_bench);
  a->batch = absl::GetFlag(FLAGS_batch);
  a->onnx = absl::GetFlag(FLAGS_onnx);
  a->data = absl::GetFlag(FLAGS_data);
  a->test_limit = absl::GetFlag(FLAGS_test_limit);
  a->baseline = absl::GetFlag(FLAGS_baseline);
  a->multipliers = absl::GetFlag(FLAGS_multipliers);
  a->device = absl::GetFlag(FLAGS_device);
  a->batch_norm = absl::GetFlag(FLAGS_batch_norm);
  a->watch = absl::GetFlag(FLAGS_watch);
  a->finish = absl::GetFlag(FLAGS_finish);
  a->input = absl::GetFlag(FLAGS_input);
  a->mean = absl::GetFlag(FLAGS_mean);
  a->std = absl::GetFlag(FLAGS_std);
  a->max_value = absl::GetFlag(FLAGS_max_value);
  a->arch = absl::GetFlag(FLAGS_arch);
  a->weight_code = absl::GetFlag(FLAGS_weight_code);
  a->weight_scales = absl::GetFlag(FLAGS_weight_scales);
  a->rank = absl::GetFlag(FLAGS_rank);
  a->world = absl::GetFlag(FLAGS_world);
  a->local_rank = absl::GetFlag(FLAGS_local_rank);
  a->rendezvous = absl::GetFlag(FLAGS_rendezvous);
  a->experiment = absl::GetFlag(FLAGS_experiment);
}

}  // namespace

bool ParseArgs(int argc, char** argv, Args* a, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool is_command = a->command.empty() && !arg.empty() && arg[0] != '-';
    if (!is_command) a->raw.push_back(arg);
    if (arg == "--help" || arg == "-h") {
      a->help = !a->command.empty() && a->command != "help";
      if (!a->help) a->command = "help";
      return true;
    }
    if (arg.rfind("--", 0) != 0) {
      if (arg.size() > 1 && arg[0] == '-') {
        *error = "unknown flag " + arg;
        return false;
      }
      if (a->command.empty()) {
        a->command = arg;
      } else {
        a->positional.push_back(arg);
      }
      continue;
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || !IsCliFlag(*flag)) {
      *error = "unknown flag " + arg;
      return false;
    }
    if (!inline_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (++i < argc) {
        value = argv[i];
        a->raw.push_back(value);
      } else {
        *error = "--" + name + " needs a value";
        return false;
      }
    }
    a->given.push_back(name);
    // --set repeats and its values may hold commas, so it is collected here rather than
    // parsed as a comma-separated list.
    if (name == "set") {
      a->sets.push_back(value);
      continue;
    }
    std::string why;
    if (!flag->ParseFrom(value, &why)) {
      *error = absl::StrCat("--", name, ": ", why);
      return false;
    }
  }
  if (a->command.empty()) a->command = "help";
  CopyFlags(a);
  return true;
}

namespace {

// The flags each command takes. The connection flags go with every command that talks to
// the daemon; --json with every command.
const std::map<std::string, std::vector<std::string>>& CommandFlagTable() {
  static const auto* table = [] {
    const std::vector<std::string> daemon = {"server", "token_file", "tls_ca"};
    std::map<std::string, std::vector<std::string>> t = {
        {"run", {"out", "resume"}},
        {"worker",
         {"out", "resume", "rank", "world", "local_rank", "rendezvous", "experiment", "server",
          "token_file", "tls_ca"}},
        {"validate", {}},
        {"inspect", {"file", "layer", "remote"}},
        {"info", {}},
        {"multipliers", {"png"}},
        {"evaluate",
         {"set", "multipliers", "weight_code", "weight_scales", "bench", "batch", "baseline",
          "device", "data", "test_limit", "remote"}},
        {"sensitivity",
         {"budget", "weight_code", "weight_scales", "device", "data", "test_limit", "remote"}},
        {"export", {"onnx", "batch", "batch_norm", "remote"}},
        {"import", {"out", "input", "mean", "std", "max_value", "arch", "data", "remote"}},
        {"seal", {}},
        {"submit", {"watch"}},
        {"list", {"state"}},
        {"get", {}},
        {"watch", {"from"}},
        {"pause", {}},
        {"resume", {}},
        {"cancel", {}},
        {"round", {"target", "step", "epochs", "finish"}},
        {"fork", {"set", "name", "watch"}},
        {"checkpoints", {}},
        {"upload", {}},
        {"download", {}},
        {"files", {"sha256"}},
        {"compare", {"png", "axis"}},
    };
    const std::set<std::string> local = {"run",         "worker", "validate", "evaluate",
                                         "sensitivity", "export", "seal"};
    // Local commands that also run in the daemon (--remote) take the connection flags too.
    const std::set<std::string> both = {"evaluate", "sensitivity", "export"};
    for (auto& [command, flags] : t) {
      flags.push_back("json");
      if (!local.count(command) || both.count(command)) {
        flags.insert(flags.end(), daemon.begin(), daemon.end());
      }
    }
    return new std::map<std::string, std::vector<std::string>>(std::move(t));
  }();
  return *table;
}

}  // namespace

absl::Status CheckCommandFlags(const Args& a) {
  const auto it = CommandFlagTable().find(a.command);
  if (it == CommandFlagTable().end()) return absl::OkStatus();
  const std::vector<std::string>& takes = it->second;
  for (const std::string& flag : a.given) {
    if (std::find(takes.begin(), takes.end(), flag) != takes.end()) continue;
    return absl::InvalidArgumentError(absl::StrCat(a.command, " does not take --", flag,
                                                   " (it takes --", absl::StrJoin(takes, ", --"),
                                                   "; see topiary ", a.command, " --help)"));
  }
  return absl::OkStatus();
}

std::string CommandUsage(const std::string& usage, const std::string& command) {
  const auto it = CommandFlagTable().find(command);
  if (it == CommandFlagTable().end()) return "";
  // An entry names the command after "topiary " or after "| " (pause ID | resume ID | ...).
  auto names = [&](absl::string_view line) {
    if (!absl::StartsWith(line, "  topiary ")) return false;
    for (absl::string_view alt : absl::StrSplit(line.substr(10), " | ")) {
      if (alt.substr(0, alt.find(' ')) == command) return true;
    }
    return false;
  };
  std::string out;
  bool in = false;
  for (absl::string_view line : absl::StrSplit(usage, '\n')) {
    if (absl::StartsWith(line, "  topiary ")) {
      in = names(line);
    } else if (!absl::StartsWith(line, "   ")) {
      in = false;  // a heading or a blank line ends the entry
    }
    if (in) absl::StrAppend(&out, line, "\n");
  }
  absl::StrAppend(&out, "\nFlags:\n");
  for (const std::string& name : it->second) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    absl::StrAppendFormat(&out, "  --%-11s %s\n", name, flag ? flag->Help() : "");
  }
  return out;
}

std::string FlagsHelp() {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsCliFlag(*flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](auto* x, auto* y) { return x->Name() < y->Name(); });
  std::string out;
  for (const auto* f : flags) absl::StrAppendFormat(&out, "  --%-11s %s\n", f->Name(), f->Help());
  return out;
}

bool ParseImageSize(const std::string& text, int* h, int* w, int* c) {
  const std::vector<std::string> parts = absl::StrSplit(text, 'x');
  int v[3] = {0, 0, 1};
  if (parts.size() < 2 || parts.size() > 3) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!absl::SimpleAtoi(parts[i], &v[i]) || v[i] < 1 || v[i] > 4096) return false;
  }
  *h = v[0];
  *w = v[1];
  *c = v[2];
  return true;
}

absl::StatusOr<std::vector<float>> ParseFloats(const std::vector<std::string>& texts,
                                               const char* flag) {
  std::vector<float> out;
  for (const std::string& t : texts) {
    float f = 0;
    if (!absl::SimpleAtof(t, &f)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", t, "' is not a number"));
    }
    out.push_back(f);
  }
  return out;
}

}  // namespace topiary
