// topiary: the command-line client. Today: local runs and spec validation; the remote
// commands against topiaryd join them with the daemon.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "clients/progress.h"
#include "pruning/checkpoint_report.h"
#include "pruning/pruner.h"
#include "trainer/device.h"
#include "trainer/events.h"
#include "trainer/model_zoo.h"
#include "trainer/runner.h"
#include "trainer/spec.h"

namespace topiary {
namespace {

// Exit codes scripts can rely on.
constexpr int kExitOk = 0;
constexpr int kExitRunFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInvalidSpec = 3;

constexpr char kUsage[] = R"(topiary: training-side pruning and approximation of CNNs

Usage:
  topiary run SPEC [--out DIR] [--resume CKPT] [--json]
      Run the experiment in SPEC (text format .textproto or JSON) in this process: dense
      training, then (with a pruning block) rounds of prune step, fine-tuning, evaluation and
      checkpoint, and a round table. A progress bar per epoch on a terminal.
      --out DIR   write spec.textproto (with defaults), events.jsonl, summary.json and
                  checkpoints/ (dense.h5, round-NNN.h5, epoch-NNNN.h5) to DIR
      --resume CKPT  continue an interrupted run of the same SPEC from one of its checkpoints
      --json      print one JSON object per event on stdout; the last line is the summary:
                  {"event":"summary", "state", "test_top1", "test_top5", "test_loss",
                   "epochs", "seconds", "device", "train_images_per_s", "checkpoint", ...}
  topiary validate SPEC [--json]
      Check SPEC without running it; print it with every default filled in.
  topiary inspect --file CKPT.h5 [--layer PATTERN] [--json]
      Report a checkpoint: provenance (experiment, round, epoch, parent), metrics, and per
      conv/linear layer the shape (OIHW), mask kind, block occupancy, sparsity and weight
      statistics. With a PATTERN (glob: '*', '?') matching one layer, a heat map of its mask.
  topiary info [--json]
      Version, build (CUDA or CPU-only), GPUs found, models available.
  topiary help | --help | -h
      This text.

Exit codes: 0 success; 1 the run failed; 2 bad command line; 3 invalid spec.
Specs: see examples/ and protos/topiary/v1/experiment.proto.
)";

constexpr char kVersion[] = "0.1.0";

struct Args {
  std::string command, spec, out, resume, file, layer;
  bool json = false;
};

bool ParseArgs(int argc, char** argv, Args* a, std::string* error) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      a->json = true;
    } else if (arg == "--out" || arg.rfind("--out=", 0) == 0) {
      if (arg == "--out") {
        if (++i >= argc) {
          *error = "--out needs a folder";
          return false;
        }
        a->out = argv[i];
      } else {
        a->out = arg.substr(6);
      }
    } else if (arg == "--file" || arg == "--layer") {
      if (++i >= argc) {
        *error = arg + " needs a value";
        return false;
      }
      (arg == "--file" ? a->file : a->layer) = argv[i];
    } else if (arg == "--resume") {
      if (++i >= argc) {
        *error = "--resume needs a checkpoint file";
        return false;
      }
      a->resume = argv[i];
    } else if (arg == "--help" || arg == "-h") {
      a->command = "help";
      return true;
    } else if (arg.rfind("-", 0) == 0) {
      *error = "unknown flag " + arg;
      return false;
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.empty()) {
    a->command = "help";
    return true;
  }
  a->command = positional[0];
  if (a->command == "run" || a->command == "validate") {
    if (positional.size() != 2) {
      *error = a->command + " needs exactly one SPEC file";
      return false;
    }
    a->spec = positional[1];
  } else if (positional.size() != 1) {
    *error = "unexpected argument " + positional[1];
    return false;
  }
  return true;
}

int Run(const Args& a) {
  const auto spec = LoadValidSpec(a.spec);
  if (!spec.ok()) {
    if (a.json) {
      topiary::v1::Event e;
      e.set_seq(1);
      e.mutable_summary()->set_state("FAILED");
      e.mutable_summary()->set_error(std::string(spec.status().message()));
      absl::PrintF("%s\n", EventToJsonLine(e));
    } else {
      absl::FPrintF(stderr, "topiary: %s\n", spec.status().message());
    }
    return kExitInvalidSpec;
  }
  ProgressPrinter printer(stderr, isatty(STDERR_FILENO) != 0);
  RunOptions options;
  options.out_dir = a.out;
  options.resume_from = a.resume;
  options.make_pruner = pruning::MakePruner;
  options.on_event = [&](const topiary::v1::Event& e) {
    if (a.json) {
      absl::PrintF("%s\n", EventToJsonLine(e));
      std::fflush(stdout);
    } else {
      printer.Print(e);
    }
  };
  const auto summary = RunExperiment(*spec, options);
  return summary.state() == "SUCCEEDED" ? kExitOk : kExitRunFailed;
}

int Validate(const Args& a) {
  const auto spec = LoadValidSpec(a.spec);
  if (!spec.ok()) {
    if (a.json) {
      absl::PrintF("{\"valid\":false,\"error\":\"%s\"}\n",
                   absl::CHexEscape(std::string(spec.status().message())));
    } else {
      absl::FPrintF(stderr, "topiary: %s\n", spec.status().message());
    }
    return kExitInvalidSpec;
  }
  const auto full = WithDefaults(*spec);
  if (a.json) {
    absl::PrintF("{\"valid\":true,\"spec\":%s}\n", MessageToJson(full));
  } else {
    absl::PrintF("%s: valid\n%s", a.spec, SpecToText(full));
  }
  return kExitOk;
}

int Inspect(const Args& a) {
  if (a.file.empty()) {
    absl::FPrintF(stderr,
                  "topiary: inspect needs --file CKPT.h5 (the daemon's inspect comes "
                  "with topiaryd)\n");
    return kExitUsage;
  }
  const auto report = pruning::InspectCheckpoint(a.file, a.layer);
  if (!report.ok()) {
    if (a.json) {
      absl::PrintF("{\"error\":\"%s\"}\n",
                   absl::CHexEscape(std::string(report.status().message())));
    } else {
      absl::FPrintF(stderr, "topiary: %s\n", report.status().message());
    }
    return kExitRunFailed;
  }
  if (a.json) {
    absl::PrintF("%s\n", MessageToJson(*report));
    return kExitOk;
  }
  const auto& r = *report;
  topiary::v1::CheckpointMetrics metrics;
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;
  (void)google::protobuf::util::JsonStringToMessage(r.metrics_json(), &metrics, lenient);
  absl::PrintF("%s (topiary checkpoint, format %d)\n", r.path(), r.format_version());
  absl::PrintF("experiment %s: %s, round %d, epoch %d, step %d, written %s\n",
               r.experiment_id().empty() ? "-" : r.experiment_id(), r.model_arch(), r.round(),
               r.epoch(), r.global_step(), r.created_at());
  if (!r.parent().empty()) absl::PrintF("parent %s\n", r.parent());
  absl::PrintF(
      "test top-1 %.2f%%, loss %.4f (dense model: %.2f%%); %d parameters; conv and "
      "linear sparsity %.1f%%\n\n",
      100 * metrics.test_top1(), metrics.test_loss(), 100 * metrics.dense_top1(), r.parameters(),
      100 * r.sparsity());
  absl::PrintF("%-30s %-16s %-8s %-13s %8s %9s %9s %9s\n", "layer", "shape (OIHW)", "mask",
               "blocks kept", "sparsity", "mean", "std", "|w| max");
  for (const auto& l : r.layers()) {
    std::vector<std::string> dims;
    for (int64_t d : l.shape()) dims.push_back(std::to_string(d));
    const std::string mask = l.mask_kind() == "n_of_m"
                                 ? absl::StrFormat("%d:%d", l.n(), l.m())
                                 : (l.mask_kind().empty() ? "-" : l.mask_kind());
    const std::string blocks =
        l.mask_kind() == "block"
            ? absl::StrFormat("%d/%d", l.blocks_kept(), l.block_rows() * l.block_cols())
            : "-";
    absl::PrintF("%-30s %-16s %-8s %-13s %7.1f%% %9.4f %9.4f %9.4f%s\n", l.layer(),
                 absl::StrJoin(dims, "x"), mask, blocks, 100 * l.sparsity(), l.stats().mean(),
                 l.stats().std(), l.stats().abs_max(),
                 l.mask_consistent() ? "" : "  (masked weights not zero!)");
  }
  if (r.layers_size() == 1 && !r.layers(0).mask_kind().empty()) {
    absl::PrintF("\n%s", pruning::MaskHeatMap(r.layers(0)));
  }
  return kExitOk;
}

int Info(const Args& a) {
  std::string why;
  const auto gpus = ListGpus(&why);
  if (a.json) {
    std::vector<std::string> g;
    for (const auto& x : gpus) {
      g.push_back(
          absl::StrFormat(R"({"ordinal":%d,"name":"%s","memory_bytes":%d,"compute":"%d.%d"})",
                          x.ordinal, x.name, x.memory_bytes, x.compute_major, x.compute_minor));
    }
    absl::PrintF(R"({"version":"%s","cuda_built":%s,"gpus":[%s],"models":["%s"]})"
                 "\n",
                 kVersion, BuiltWithCuda() ? "true" : "false", absl::StrJoin(g, ","),
                 absl::StrJoin(ModelNames(), "\",\""));
    return kExitOk;
  }
  absl::PrintF("topiary %s (%s build)\n", kVersion, BuiltWithCuda() ? "CUDA" : "CPU-only");
  if (gpus.empty()) absl::PrintF("GPUs: none (%s)\n", why);
  for (const auto& x : gpus) {
    absl::PrintF("GPU %d: %s, %.1f GiB, compute %d.%d\n", x.ordinal, x.name,
                 x.memory_bytes / 1073741824.0, x.compute_major, x.compute_minor);
  }
  absl::PrintF("models: %s\n", absl::StrJoin(ModelNames(), ", "));
  return kExitOk;
}

}  // namespace
}  // namespace topiary

int main(int argc, char** argv) {
  using namespace topiary;
  Args args;
  std::string error;
  if (!ParseArgs(argc, argv, &args, &error)) {
    absl::FPrintF(stderr, "topiary: %s\n\n%s", error, kUsage);
    return kExitUsage;
  }
  if (args.command == "help") {
    absl::PrintF("%s", kUsage);
    return kExitOk;
  }
  if (args.command == "run") return Run(args);
  if (args.command == "validate") return Validate(args);
  if (args.command == "info") return Info(args);
  if (args.command == "inspect") return Inspect(args);
  absl::FPrintF(stderr, "topiary: unknown command '%s'\n\n%s", args.command, kUsage);
  return kExitUsage;
}
