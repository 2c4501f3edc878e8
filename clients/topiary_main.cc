// topiary: the command-line client: local runs, validation and checkpoint inspection, and
// the remote commands against topiaryd (clients/remote.h).
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/approx_commands.h"
#include "clients/args.h"
#include "clients/progress.h"
#include "clients/remote.h"
#include "clients/report_print.h"
#include "clients/text.h"
#include "clients/worker.h"
#include "protos/version.h"
#include "pruning/pruner.h"
#include "trainer/core/device.h"
#include "trainer/data/dataset.h"
#include "trainer/export/onnx_export.h"
#include "trainer/import/onnx_import.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/run/events.h"
#include "trainer/run/runner.h"
#include "trainer/spec/spec.h"
#include "trainer/store/checkpoint_report.h"
#include "trainer/store/hdf5_file.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

constexpr char kUsage[] = R"(topiary: training-side pruning and approximation of CNNs

Local commands (no daemon needed):
  topiary run SPEC [--out DIR] [--resume CKPT] [--json]
      Run the experiment in SPEC (text format .textproto or JSON) in this process: dense
      training, then (with a pruning block) rounds of prune step, fine-tuning, evaluation and
      checkpoint, and a round table. A progress bar per epoch on a terminal.
      --out DIR   write spec.textproto (with defaults), events.jsonl, summary.json and
                  checkpoints/ (dense.h5, round-NNN.h5, epoch-NNNN.h5) to DIR
      --resume CKPT  continue an interrupted run of the same SPEC from one of its checkpoints
      --json      one JSON object per event on stdout; the last line is the summary:
                  {"event":"summary", "state", "test_top1", "test_top5", "test_loss",
                   "epochs", "seconds", "device", "checkpoint", "rounds", ...}
  topiary worker SPEC [--out DIR] [--resume CKPT] [--rank R --world N] [--local_rank L]
                 [--rendezvous DIR] [--json]
      One rank of SPEC run by several processes, one per rank (device.gpu_count or
      device.cpu_ranks ranks in all; Slurm's srun starts one per task). Rank, world size
      and local rank come from the flags or from SLURM_PROCID, SLURM_NTASKS and
      SLURM_LOCALID. The processes meet in the rendezvous directory (shared by all; under
      Slurm by default OUT/rendezvous/jobJOB.STEP): NCCL's unique id for GPUs, Gloo's
      store for CPU ranks. Rank 0 writes DIR and prints the events as run does; the others
      print their summary. SIGUSR1 pauses (pause.h5), SIGTERM cancels. Environment: NCCL's
      (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...), GLOO_SOCKET_IFNAME for CPU ranks.
  topiary validate SPEC [--json]
      Check SPEC without running it; print it with every default filled in.
  topiary inspect CKPT.h5 [--layer PATTERN] [--json]
      Report a checkpoint: provenance (experiment, round, epoch, parent), metrics, and per
      conv/linear layer the shape (OIHW), mask kind, block occupancy, sparsity and weight
      statistics. With a PATTERN (glob: '*', '?') matching one layer, a heat map of its mask.
  topiary info [--json]
      Version, build (CUDA or CPU-only), GPUs found, models; and the daemon, if one answers:
      its queue and each GPU's occupant (--json: "daemon", null when none answers).
  topiary multipliers [NAME|FILE.bin ...] [--json] [--png FILE]
      Error metrics of 8x8-bit multipliers over all 2^16 operand pairs (MAE, WCE and their %,
      EP%, MRE%, MSE), the table's SHA-256, and power and area where the table is a known
      EvoApprox circuit. NAME: exact, trunc:T, trunc_a:T, trunc_w:T, bam:V, mitchell, drum:K,
      or a shipped EvoApprox table by name (mul8u_L40, ...: $TOPIARY_MULTIPLIERS, else the
      folder installed beside topiary); FILE.bin: a 131,072-byte table.
      Without arguments, a sample of the generated families. With --server ADDR, the
      tables in the daemon's DATA_DIR/multipliers/ folder and its families (a spec's rule
      names such a table by its stem, e.g. multiplier: "mul8u_L40"). --png FILE (one
      multiplier): a 256x256 picture of its error surface, row = activation code, column =
      weight code, red where the table is too large, blue too small, white exact.
  topiary evaluate CKPT [--set PATTERN=MULTIPLIER]... [--weight_code CODE]
                   [--weight_scales SCALES] [--data DATA] [--test_limit N] [--json]
      Evaluate a checkpoint on its test set (model, data and device from its spec), without
      training. --data another data set (fashion_mnist, mnist:PATH, cifar10:PATH,
      cifar100:PATH, digits:FILE, folder:PATH): what an imported network that recorded none
      needs; --test_limit N: the first N test images. Each --set makes the conv layers matching PATTERN approximate with MULTIPLIER
      (a family or a .bin file; 'none' keeps them exact); a later --set wins. Without --set,
      the checkpoint's own approximation. --weight_code sign_magnitude: weights as a sign and
      a 7-bit magnitude (a zero weight contributes exactly 0), asymmetric: TFApprox's codes.
      --weight_scales per_channel: one weight scale per output channel, per_tensor: one per
      layer. Warns (stderr) for each layer whose multiplier errs at least 3x more, relative
      to the products, at the codes the layer uses (test set's first batch) than over its
      whole table. --json: {"top1", "top5", "loss", "images", "rules", "code_use"}.
  topiary evaluate CKPT --multipliers M1,M2,... [--weight_code CODE1,CODE2] [--json]
      Every convolution under each multiplier in turn (and each weight code of the list):
      one row per pair with the test top-1, top-5, loss and the multiplier's power where it is
      a known EvoApprox circuit. --json: one object per row.
  topiary evaluate CKPT --bench [--batch N] [--baseline CKPT0] [--device cpu|cuda] [--json]
      The deployment question: with dense kernels only and with block-sparse kernels where
      they measure faster (block-masked layers, GPU), the test top-1 and loss, images/s at N
      (default 256), one image's latency (captured forward passes), the board's energy per
      image (NVML) and each convolution's time for one image (eager, synchronized per layer).
      --baseline CKPT0: the same for CKPT0 (e.g. the dense parent of a channel-pruned
      checkpoint) on the same device, then CKPT against CKPT0: multiply-adds and parameters
      kept, throughput and latency speed-ups, energy per image, top-1 change. --device: measure
      on the CPU or the GPU whatever the checkpoint's spec says (also without --bench).
      --json: one object per engine and checkpoint ("role"), then one "compare" per engine.
  topiary export CKPT --onnx FILE [--batch N|dynamic] [--batch_norm fold|keep] [--json]
      Write the checkpoint's network as an ONNX model (opset 13, IR version 7) for inference
      runtimes: input "input" [N, C, H, W] of raw pixel values (0..255 for 8-bit images; the
      checkpoint's normalization is the graph's first nodes), output "logits" [N, classes].
      Masks applied: pruned weights are exact zeros. --batch: a fixed N (default 1) or
      'dynamic'. --batch_norm: fold into the convolutions (default) or keep the nodes.
      Approximate convolutions are exported exact (ONNX has no multiplier tables); the
      summary names them. See docs/onnx-export.md.
  topiary import MODEL.onnx --out CKPT.h5 [--input HxWxC] [--mean M,...] [--std S,...]
                 [--max_value V] [--arch NAME] [--data DATA] [--json]
      Turn an ONNX model (exported from PyTorch, say) into a checkpoint whose network any
      experiment can start from: a spec without model.arch and init_from_checkpoint: CKPT.
      Reads Conv (grouped, depthwise), BatchNormalization, Relu, Clip (ReLU6), Add, MaxPool,
      AveragePool, GlobalAveragePool, Flatten/Reshape, Gemm, MatMul(+Add), Concat;
      anything else is refused naming the node. --mean/--std: the normalization the model
      was trained with, on pixels / max_value (recorded; runs from CKPT use it). --data: the
      data set to record (as evaluate's), so that `topiary evaluate CKPT` needs no spec. With
      --remote, MODEL.onnx and CKPT.h5 are paths in the daemon's data directory and the daemon
      imports (CKPT.h5 must not exist yet). --json: the ImportSummary. See docs/import.md.
  topiary seal FILE.h5... [--json]
      Give HDF5 files Topiary's seal (a CRC-32 of the whole file in a 512-byte user block),
      rewriting each in place: checkpoints written before the seal existed (0.9), or edited
      by another tool. Every reader (and topiaryd) refuses a file without a valid seal
      before libhdf5 parses it; sealing parses the file unchecked, so seal only files you
      trust. Checkpoints written by Topiary are sealed already.
  topiary sensitivity CKPT NAME|FILE.bin... [--budget PTS] [--weight_code CODE]
                      [--weight_scales SCALES] [--device cpu|cuda] [--json]
      For every conv layer and each multiplier, the test top-1 with only that layer
      approximate; then a greedy assignment that minimizes the multipliers' power (summed over
      each image's multiply-accumulates; known EvoApprox circuits only) while the top-1 stays
      within PTS points (default 1) of the exact model, checked by evaluating it. Weight codes
      and scales as for evaluate (default: the checkpoint's own); the same code-use warnings.

Commands against topiaryd (--server ADDR or $TOPIARY_SERVER, default 127.0.0.1:7077;
--token_file FILE or $TOPIARY_TOKEN_FILE for a bearer token; --tls_ca FILE for TLS):
  topiary submit SPEC [--watch]          queue an experiment; --watch follows it
  topiary list [--state STATE]           experiments, oldest first
  topiary get ID                         one experiment
  topiary watch ID [--from SEQ]          its events (progress bars, rounds), until it ends
  topiary pause ID | resume ID | cancel ID
  topiary round ID [--target X] [--step F] [--epochs N]
                                         start the next manual round (pruning.manual_rounds)
  topiary round ID --finish              end the manual rounds: the run finishes now
  topiary fork CKPT [--set field=value]... [--name NAME] [--watch]
                                         new experiment from a checkpoint, e.g.
                                         --set pruning.target=0.75; a list entry:
                                         approximation.rules[0].multiplier=drum:6; drop a
                                         block: pruning=none; replace one whole:
                                         'approximation={rules {layer: "*" ...}}';
                                         train.epochs=N fine-tunes first (docs/remote.md)
  topiary checkpoints ID                 its checkpoints (paths relative to the data directory)
  topiary compare ID ID... [--png FILE [--axis sparsity|macs]]
                                         experiments side by side: method, target,
                                         multiplier (power), parent, final and per-round
                                         top-1, sparsity, mult-adds, step time, energy, and
                                         what differs in their specs; --png: top-1 against
                                         sparsity (or mult-adds) per round, one curve each
  topiary inspect --remote CKPT [--layer PATTERN]
                                         a checkpoint report through the daemon
  topiary import --remote MODEL.onnx --out CKPT.h5 [...]
                                         the daemon imports a model in its data directory
                                         into a new checkpoint there (two at once at most)
  topiary evaluate --remote CKPT [...] | sensitivity --remote CKPT MULT... [...] | export --remote CKPT --onnx FILE [...]
                                         the daemon runs the command on files in its data
                                         directory, with the same output as here: evaluate
                                         and sensitivity on a device it waits for in the
                                         experiments' queue; export's FILE is a new file in
                                         the data directory (then `topiary download` it)
  topiary upload LOCAL REMOTE            a file or a folder (everything under it) into the
                                         data directory, checksummed; files already there
                                         with the same SHA-256 are skipped, so a failed upload
                                         is run again; never replaces a file, never into
                                         experiments/
  topiary download REMOTE [LOCAL]        a file or folder of the data directory (a checkpoint,
                                         an ONNX export, an events.jsonl); a broken download
                                         continues from LOCAL.part when run again
  topiary files [REMOTE] [--sha256]      the files in the data directory (or under REMOTE)
Every command takes --json; a flag a command does not take is refused (exit 2).

  topiary help | --help | -h             this text
  topiary COMMAND --help                 that command's usage and the flags it takes

Exit codes: 0 success; 1 the run or experiment failed or was cancelled; 2 bad command line;
3 invalid spec or request; 4 not found; 5 the experiment's state does not allow it; 6 no
daemon answering; 7 unauthenticated or a path outside the data directory; 8 queue full or
request too large.
Specs: see examples/ and protos/topiary/v1/experiment.proto.
)";

// run, and worker's rank 0: the experiment in this process, its events printed; a worker of
// another rank prints only how it ended (its summary; rank 0 reports the run).
int RunSpec(const Args& a, const char* command, const World& world, RunControl* control,
            EventReporter* reporter = nullptr) {
  if (a.positional.size() != 1) {
    absl::FPrintF(stderr, "topiary: %s needs exactly one SPEC file (see topiary --help)\n",
                  command);
    return kExitUsage;
  }
  const auto spec = LoadValidSpec(a.positional[0]);
  if (!spec.ok()) {
    if (a.json) {
      topiary::v1::Event e;
      e.set_seq(1);
      e.mutable_summary()->set_state(topiary::v1::FAILED);
      e.mutable_summary()->set_error(std::string(spec.status().message()));
      absl::PrintF("%s\n", EventToJsonLine(e));
    } else {
      absl::FPrintF(stderr, "topiary: %s\n", TerminalText(spec.status().message()));
    }
    return kExitInvalid;
  }
  ProgressPrinter printer(stderr, isatty(STDERR_FILENO) != 0);
  RunOptions options;
  options.out_dir = a.out;
  options.resume_from = a.resume;
  options.make_pruner = pruning::MakePruner;
  options.control = control;
  options.world = world;
  auto print = [&](const topiary::v1::Event& e) {
    if (a.json) {
      absl::PrintF("%s\n", EventToJsonLine(e));
      std::fflush(stdout);
    } else {
      printer.Print(e);
    }
  };
  options.on_event = [&](const topiary::v1::Event& e) {
    print(e);
    if (reporter != nullptr) reporter->Send(e);
  };
  // Reporting to a daemon: its registry keeps the experiment's event log.
  options.write_event_log = reporter == nullptr;
  const auto summary = RunExperiment(*spec, options);
  if (world.rank != 0) {
    topiary::v1::Event e;
    *e.mutable_summary() = summary;
    print(e);
  }
  return summary.state() == topiary::v1::SUCCEEDED ? kExitOk : kExitFailed;
}

int Run(const Args& a) { return RunSpec(a, "run", World{}, nullptr); }

int Worker(const Args& a) {
  WorkerFlags flags;
  flags.rank = a.rank;
  flags.world = a.world;
  flags.local_rank = a.local_rank;
  flags.rendezvous = a.rendezvous;
  flags.out = a.out;
  const auto world = ResolveWorld(flags, [](const char* name) { return std::getenv(name); });
  if (!world.ok()) {
    absl::FPrintF(stderr, "topiary: %s\n", world.status().message());
    return kExitUsage;
  }
  SignalControl control;
  std::unique_ptr<EventReporter> reporter;
  if (!a.experiment.empty() && world->rank == 0) {
    const char* job = std::getenv("SLURM_JOB_ID");
    reporter = std::make_unique<EventReporter>(a, job ? job : "");
  }
  return RunSpec(a, "worker", *world, &control, reporter.get());
}

int Validate(const Args& a) {
  if (a.positional.size() != 1) {
    absl::FPrintF(stderr, "topiary: validate needs exactly one SPEC file (see topiary --help)\n");
    return kExitUsage;
  }
  const auto spec = LoadValidSpec(a.positional[0]);
  if (!spec.ok()) {
    if (a.json) {
      absl::PrintF("{\"valid\":false,\"error\":%s}\n", JsonString(spec.status().message()));
    } else {
      absl::FPrintF(stderr, "topiary: %s\n", TerminalText(spec.status().message()));
    }
    return kExitInvalid;
  }
  const auto full = WithDefaults(*spec);
  // The dataset's files as this machine has them (a daemon checks its own at submission).
  if (auto st = CheckDatasetFiles(full.data()); !st.ok()) {
    if (a.json) {
      absl::PrintF("{\"valid\":false,\"error\":%s}\n", JsonString(st.message()));
    } else {
      absl::FPrintF(stderr, "topiary: %s\n", TerminalText(st.message()));
    }
    return kExitInvalid;
  }
  if (a.json) {
    absl::PrintF("{\"valid\":true,\"spec\":%s}\n", ScriptJson(full));
  } else {
    absl::PrintF("%s: valid\n%s", a.positional[0], SpecToText(full));
  }
  return kExitOk;
}

// Like export, evaluate and sensitivity, a checkpoint named here is a local file (--remote:
// one in the daemon's data directory).
int Inspect(const Args& a) {
  if (a.file.empty() && a.positional.size() != 1) {
    absl::FPrintF(stderr, "topiary: inspect needs one checkpoint file; see topiary --help\n");
    return kExitUsage;
  }
  const auto report = InspectCheckpoint(a.file.empty() ? a.positional[0] : a.file, a.layer);
  if (!report.ok()) return Fail(a, report.status());
  PrintCheckpointReport(*report, a.json);
  return kExitOk;
}

int Export(const Args& a) {
  if (a.positional.size() != 1 || a.onnx.empty()) {
    absl::FPrintF(stderr, "topiary: export needs one CKPT and --onnx FILE (see topiary --help)\n");
    return kExitUsage;
  }
  OnnxExportOptions options;
  if (a.batch == "dynamic") {
    options.batch = 0;
  } else if (!a.batch.empty() &&
             (!absl::SimpleAtoi(a.batch, &options.batch) || options.batch < 1)) {
    return Fail(a, absl::InvalidArgumentError("--batch: a positive integer or 'dynamic', not '" +
                                              a.batch + "'"));
  }
  if (a.batch_norm != "fold" && a.batch_norm != "keep") {
    return Fail(a, absl::InvalidArgumentError("--batch_norm: 'fold' or 'keep', not '" +
                                              a.batch_norm + "'"));
  }
  options.fold_batch_norm = a.batch_norm == "fold";
  const auto s = ExportCheckpointToOnnx(a.positional[0], options, a.onnx);
  if (!s.ok()) return Fail(a, s.status());
  if (a.json) {
    absl::PrintF(R"({"onnx":%s,"opset":%d,"ir_version":%d,"batch":%s,"batch_norm":"%s","nodes":%d,)"
                 R"("parameters":%d,"initializer_floats":%d,"weight_zeros":%d,"masked":%d,)"
                 R"("folded":%d,"bytes":%d,)"
                 R"("approximate_layers_exported_exact":[%s]})"
                 "\n",
                 JsonString(a.onnx), kOnnxOpset, kOnnxIrVersion,
                 options.batch > 0 ? std::to_string(options.batch) : std::string("\"dynamic\""),
                 a.batch_norm, s->nodes, s->parameters, s->initializer_floats, s->zeros, s->masked,
                 s->folded, s->bytes,
                 s->approximate_layers.empty()
                     ? std::string()
                     : "\"" + absl::StrJoin(s->approximate_layers, "\",\"") + "\"");
    return kExitOk;
  }
  absl::PrintF("%s: %d nodes, %d parameters (%d weights zero, %d of them masked), opset %d, %s\n",
               a.onnx, s->nodes, s->parameters, s->zeros, s->masked, kOnnxOpset,
               options.fold_batch_norm ? absl::StrFormat("%d batch norms folded", s->folded)
                                       : std::string("batch norm kept"));
  if (!s->approximate_layers.empty()) {
    absl::FPrintF(stderr,
                  "topiary: note: approximate layers exported as exact convolutions (ONNX has no "
                  "multiplier tables): %s\n",
                  absl::StrJoin(s->approximate_layers, ", "));
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
    // The daemon's view (each GPU's occupant), or null when none answers.
    std::string why;
    const auto daemon = FetchRemoteInfo(a, &why);
    absl::PrintF(R"({"version":"%s","cuda_built":%s,"gpus":[%s],"models":["%s"],"daemon":%s})"
                 "\n",
                 kTopiaryVersion, BuiltWithCuda() ? "true" : "false", absl::StrJoin(g, ","),
                 absl::StrJoin(ModelNames(), "\",\""),
                 daemon ? ScriptJson(*daemon) : std::string("null"));
    return kExitOk;
  }
  absl::PrintF("topiary %s (%s build)\n", kTopiaryVersion, BuiltWithCuda() ? "CUDA" : "CPU-only");
  if (gpus.empty()) absl::PrintF("GPUs: none (%s)\n", why);
  for (const auto& x : gpus) {
    absl::PrintF("GPU %d: %s, %.1f GiB, compute %d.%d\n", x.ordinal, x.name,
                 x.memory_bytes / 1073741824.0, x.compute_major, x.compute_minor);
  }
  absl::PrintF("models: %s\n", absl::StrJoin(ModelNames(), ", "));
  PrintRemoteInfo(a);
  return kExitOk;
}

int Seal(const Args& a) {
  if (a.positional.empty()) {
    absl::FPrintF(stderr, "topiary: seal needs one or more FILE.h5 (see topiary --help)\n");
    return kExitUsage;
  }
  for (const std::string& path : a.positional) {
    if (absl::Status st = SealH5File(path); !st.ok()) return Fail(a, st);
    if (a.json) {
      absl::PrintF("{\"sealed\":%s}\n", JsonString(path));
    } else {
      absl::PrintF("%s: sealed\n", path);
    }
  }
  return kExitOk;
}

int Import(const Args& a) {
  if (a.positional.size() != 1 || a.out.empty()) {
    absl::FPrintF(stderr,
                  "topiary: import needs one MODEL.onnx and --out CKPT.h5 (see topiary --help)\n");
    return kExitUsage;
  }
  OnnxImportOptions options;
  if (!a.input.empty() &&
      !ParseImageSize(a.input, &options.height, &options.width, &options.channels)) {
    return Fail(
        a, absl::InvalidArgumentError("--input: HxWxC (e.g. 224x224x3), not '" + a.input + "'"));
  }
  auto mean = ParseFloats(a.mean, "mean");
  if (!mean.ok()) return Fail(a, mean.status());
  auto std = ParseFloats(a.std, "std");
  if (!std.ok()) return Fail(a, std.status());
  options.mean = *mean;
  options.std = *std;
  if (a.max_value) options.max_value = static_cast<float>(*a.max_value);
  options.arch = a.arch;
  options.data = a.data;
  const auto s = ImportOnnxFile(a.positional[0], a.out, options);
  if (!s.ok()) return Fail(a, s.status());
  PrintImportSummary(*s, a.json);
  return kExitOk;
}

// topiaryd runs this binary for remote commands (server/command_runner.h) with its own file
// policies in the environment: reads and writes stay where the daemon's would.
void ApplyDaemonPolicies() {
  const char* read_roots = std::getenv("TOPIARY_READ_ROOTS");
  if (read_roots != nullptr && *read_roots != '\0') {
    ReadPolicy policy;
    policy.roots = absl::StrSplit(read_roots, ':', absl::SkipEmpty());
    uint64_t max_bytes = 0;
    const char* limit = std::getenv("TOPIARY_MAX_FILE_BYTES");
    if (limit != nullptr && absl::SimpleAtoi(limit, &max_bytes) && max_bytes > 0) {
      policy.max_file_bytes = max_bytes;
    }
    SetReadPolicy(policy);
  }
  const char* write_roots = std::getenv("TOPIARY_WRITE_ROOTS");
  if (write_roots != nullptr && *write_roots != '\0') {
    SetWriteRoots(absl::StrSplit(write_roots, ':', absl::SkipEmpty()));
  }
}

}  // namespace
}  // namespace topiary

int main(int argc, char** argv) {
  using namespace topiary;
  ApplyDaemonPolicies();
  Args args;
  std::string error;
  if (!ParseArgs(argc, argv, &args, &error)) {
    absl::FPrintF(stderr, "topiary: %s (see topiary --help)\n", error);
    return kExitUsage;
  }
  const std::string& c = args.command;
  if (c == "help") {
    absl::PrintF("%s\nFlags:\n%s", kUsage, FlagsHelp());
    return kExitOk;
  }
  if (args.help) {
    const std::string usage = CommandUsage(kUsage, c);
    if (usage.empty()) {
      absl::FPrintF(stderr, "topiary: unknown command '%s' (see topiary --help)\n", c);
      return kExitUsage;
    }
    absl::PrintF("%s", usage);
    return kExitOk;
  }
  if (const absl::Status st = CheckCommandFlags(args); !st.ok()) {
    absl::FPrintF(stderr, "topiary: %s\n", st.message());
    return kExitUsage;
  }
  if (c == "run") return Run(args);
  if (c == "worker") return Worker(args);
  if (c == "validate") return Validate(args);
  if (c == "info") return Info(args);
  // With --server, the daemon's library; otherwise the tables and families named here.
  if (c == "multipliers") {
    return args.server.empty() ? MultipliersCommand(args) : RunRemoteCommand(args);
  }
  if (c == "evaluate") return args.remote ? RunInDaemon(args) : EvaluateCommand(args);
  if (c == "sensitivity") return args.remote ? RunInDaemon(args) : SensitivityCommand(args);
  if (c == "export") return args.remote ? RunInDaemon(args) : Export(args);
  if (c == "import" && !args.remote) return Import(args);
  if (c == "seal") return Seal(args);
  if (c == "inspect" && !args.remote) return Inspect(args);
  if (IsRemoteCommand(c)) return RunRemoteCommand(args);
  absl::FPrintF(stderr, "topiary: unknown command '%s' (see topiary --help)\n", c);
  return kExitUsage;
}
