// topiaryd: the Topiary daemon. Serves topiary.v1.Topiary (plus grpc.health.v1 and server
// reflection) and runs the submitted experiments on the GPUs (one at a time per GPU) or the
// CPU. See `topiaryd --help`.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "protos/version.h"
#include "server/auth_interceptor.h"
#include "server/command_runner.h"
#include "server/file_transfer.h"
#include "server/registry.h"
#include "server/scheduler.h"
#include "server/service.h"
#include "server/slurm.h"
#include "trainer/approx/multiplier.h"
#include "trainer/core/device.h"
#include "trainer/nn/plan_cache.h"
#include "trainer/util/file_util.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7077",
          "address to serve on (port 0 picks a free one); a non-loopback address needs "
          "--token_file");
ABSL_FLAG(std::string, data_dir, "",
          "experiments, event logs and checkpoints (default $XDG_DATA_HOME/topiary or "
          "~/.local/share/topiary)");
ABSL_FLAG(std::string, gpus, "",
          "GPU ordinals to use, e.g. 0,1 (default: every GPU found; \"none\": the CPU)");
ABSL_FLAG(int, max_running, 1, "experiments running at once without a GPU; with GPUs, one per GPU");
ABSL_FLAG(int, max_queued, 256, "queued experiments accepted (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, max_restarts, 3,
          "an experiment that was running when the daemon died this many times is marked "
          "FAILED instead of being restarted again");
ABSL_FLAG(int64_t, max_file_bytes, int64_t{2} << 30,
          "the largest dataset or checkpoint file a run may read, and the most a gzip "
          "dataset may inflate to");
ABSL_FLAG(std::string, token_file, "",
          "require \"authorization: Bearer <token>\" on every call but grpc.health.v1, with "
          "the token in this file");
ABSL_FLAG(std::string, tls_cert, "", "serve TLS with this certificate chain (PEM)");
ABSL_FLAG(std::string, tls_key, "", "... and this private key (PEM)");
ABSL_FLAG(std::string, topiary_binary, "",
          "the topiary client binary that remote evaluate, sensitivity and export run (default: "
          "the one beside topiaryd)");
ABSL_FLAG(std::string, port_file, "", "write the port actually listened on here (for scripts)");
ABSL_FLAG(std::string, scheduler, "local",
          "local: experiments run in this process on its GPUs (or CPU); slurm: each one is a "
          "Slurm job (sbatch) of `topiary worker` tasks, and --data_dir must be on storage "
          "every node shares");
ABSL_FLAG(std::string, slurm_sbatch_args, "",
          "--scheduler slurm: arguments added to every sbatch, space-separated (e.g. "
          "\"--partition=gpu --account=lab\")");
ABSL_FLAG(int, slurm_max_jobs, 64, "--scheduler slurm: the experiments' jobs in Slurm at once");
ABSL_FLAG(std::string, report_address, "",
          "--scheduler slurm: host:port where the jobs reach this daemon (default: this host's "
          "name and the port listened on)");

namespace topiary::server {
namespace {

constexpr int kMaxMetadataBytes = 16 << 10;
constexpr int kMaxStreamsPerConnection = 64;
constexpr int kMaxServerThreads = 256;

// A fresh daemon's multiplier library (DATA_DIR/multipliers/, which specs name tables from)
// starts with the EvoApprox tables shipped with Topiary; an existing folder is left as it is.
void SeedMultiplierLibrary(const std::string& folder) {
  if (PathExists(folder)) return;
  const std::vector<std::string> shipped = ShippedMultiplierFolders();
  if (shipped.empty()) {
    absl::FPrintF(stderr,
                  "topiaryd: %s/ holds no multiplier tables and no shipped ones were found (set "
                  "TOPIARY_MULTIPLIERS to data/multipliers/evoapprox8b); put NAME.bin files "
                  "(131,072 bytes) there to name them in specs\n",
                  folder);
    return;
  }
  if (!MakeDirs(folder).ok()) return;
  int copied = 0;
  std::error_code ec;  // the non-throwing iterator: an unreadable folder copies nothing
  for (const auto& entry : std::filesystem::directory_iterator(shipped[0], ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::EndsWith(name, ".bin")) continue;
    auto bytes = ReadFile(entry.path().string());
    if (bytes.ok() && WriteFileAtomic(folder + "/" + name, *bytes).ok()) ++copied;
  }
  absl::FPrintF(stderr, "topiaryd: %s/: %d shipped EvoApprox tables copied from %s\n", folder,
                copied, shipped[0]);
}

constexpr char kUsage[] = R"(topiaryd: the Topiary daemon (gRPC service topiary.v1.Topiary)

Usage: topiaryd [--listen ADDR] [--data_dir DIR] [--gpus 0,1|none] [--max_running N]
                [--max_queued N] [--max_restarts N] [--max_file_bytes N] [--token_file FILE]
                [--tls_cert FILE --tls_key FILE] [--port_file FILE] [--topiary_binary FILE]
                [--scheduler local|slurm] [--slurm_sbatch_args ARGS] [--slurm_max_jobs N]
                [--report_address HOST:PORT]

SIGINT/SIGTERM stop the daemon: running experiments checkpoint and resume on the next start.
After a crash (kill -9) the next start re-queues what was running from its last checkpoint.
Runs read datasets only from the data directory and /usr/share/datasets, following no link
out of them.)";

bool IsLoopback(const std::string& addr) {
  const std::string host = addr.substr(0, addr.rfind(':'));
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1" ||
         host.rfind("127.", 0) == 0;
}

int Fail(const std::string& message) {
  absl::FPrintF(stderr, "topiaryd: %s\n", message);
  return 2;
}

// The flags' values, read once after parsing.
struct Flags {
  std::string listen = absl::GetFlag(FLAGS_listen), data_dir = absl::GetFlag(FLAGS_data_dir),
              gpus = absl::GetFlag(FLAGS_gpus), token_file = absl::GetFlag(FLAGS_token_file),
              tls_cert = absl::GetFlag(FLAGS_tls_cert), tls_key = absl::GetFlag(FLAGS_tls_key),
              port_file = absl::GetFlag(FLAGS_port_file),
              topiary_binary = absl::GetFlag(FLAGS_topiary_binary),
              scheduler = absl::GetFlag(FLAGS_scheduler),
              slurm_sbatch_args = absl::GetFlag(FLAGS_slurm_sbatch_args),
              report_address = absl::GetFlag(FLAGS_report_address);
  int slurm_max_jobs = absl::GetFlag(FLAGS_slurm_max_jobs);
  int max_running = absl::GetFlag(FLAGS_max_running), max_queued = absl::GetFlag(FLAGS_max_queued),
      max_restarts = absl::GetFlag(FLAGS_max_restarts);
  int64_t max_file_bytes = absl::GetFlag(FLAGS_max_file_bytes);
};

// The checks of the flags' values; fills in the default data directory.
absl::Status CheckFlags(Flags* f) {
  if (f->max_running <= 0) return absl::InvalidArgumentError("--max_running: must be > 0");
  if (f->scheduler != "local" && f->scheduler != "slurm") {
    return absl::InvalidArgumentError("--scheduler: '" + f->scheduler + "' is not local or slurm");
  }
  if (f->slurm_max_jobs <= 0) return absl::InvalidArgumentError("--slurm_max_jobs: must be > 0");
  if (f->max_queued <= 0) return absl::InvalidArgumentError("--max_queued: must be > 0");
  if (f->max_restarts <= 0) return absl::InvalidArgumentError("--max_restarts: must be > 0");
  if (f->max_file_bytes <= 0) return absl::InvalidArgumentError("--max_file_bytes: must be > 0");
  if (f->tls_cert.empty() != f->tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (f->data_dir.empty()) {
    const char* xdg = std::getenv("XDG_DATA_HOME");
    const char* home = std::getenv("HOME");
    f->data_dir = xdg ? absl::StrCat(xdg, "/topiary")
                      : absl::StrCat(home ? home : ".", "/.local/share/topiary");
  }
  return absl::OkStatus();
}

// The bearer token (--token_file) and the server's credentials (TLS with --tls_cert).
absl::Status ReadCredentials(const Flags& f, std::string* token,
                             std::shared_ptr<grpc::ServerCredentials>* creds) {
  if (!f.token_file.empty()) {
    auto text = ReadFile(f.token_file, 4096);
    if (!text.ok())
      return absl::InvalidArgumentError(absl::StrCat("--token_file: ", text.status().message()));
    *token = std::string(absl::StripAsciiWhitespace(*text));
    if (token->empty()) return absl::InvalidArgumentError("--token_file: the file is empty");
  }
  if (!IsLoopback(f.listen) && token->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", f.listen,
        " is not a loopback address: refusing to serve without --token_file (anyone who can "
        "reach it could run code paths on this machine's GPUs and read its checkpoints)"));
  }
  *creds = grpc::InsecureServerCredentials();
  if (f.tls_cert.empty()) return absl::OkStatus();
  auto cert = ReadFile(f.tls_cert, 1 << 20);
  auto key = ReadFile(f.tls_key, 1 << 20);
  if (!cert.ok())
    return absl::InvalidArgumentError(absl::StrCat("--tls_cert: ", cert.status().message()));
  if (!key.ok())
    return absl::InvalidArgumentError(absl::StrCat("--tls_key: ", key.status().message()));
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  *creds = grpc::SslServerCredentials(ssl);
  return absl::OkStatus();
}

// Slots per GPU (--gpus), or CPU slots.
void ChooseDevices(const Flags& f, SchedulerOptions* scheduler, ServiceOptions* service) {
  std::string why;
  const std::vector<GpuInfo> gpus = ListGpus(&why);
  if (f.gpus != "none") {
    for (const GpuInfo& g : gpus) {
      bool wanted = f.gpus.empty();
      for (absl::string_view o : absl::StrSplit(f.gpus, ',', absl::SkipEmpty())) {
        int n;
        wanted = wanted || (absl::SimpleAtoi(o, &n) && n == g.ordinal);
      }
      if (wanted) {
        scheduler->gpus.push_back(g.ordinal);
        service->gpu_names.push_back(g.name);
        service->devices.push_back(absl::StrCat("cuda:", g.ordinal, " ", g.name));
      }
    }
  }
  scheduler->cpu_slots = f.max_running;
  if (scheduler->gpus.empty()) service->devices.push_back("cpu");
  service->max_queued = f.max_queued;
}

// Writes stay in the data directory, whatever links are planted in it (and in the folders of
// the operator's own files: --port_file, the user's plan cache).
absl::Status SetFilePolicies(const Flags& f, const ServiceOptions& service) {
  if (auto st = MakeDirs(f.data_dir); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--data_dir: ", st.message()));
  }
  // Convolution plans measured by any run are kept here (and in the user's cache folder) for
  // the next start of the same shapes (trainer/nn/plan_cache.h).
  ConvPlanCache::Global().AddFile(f.data_dir + "/plan_cache/conv_plans.tsv");
  // The operator's own files are allowed one by one, not their folders: a --port_file in
  // /tmp does not let the daemon write anywhere else in /tmp.
  std::vector<std::string> own_files = ConvPlanCache::Global().files();
  if (!f.port_file.empty()) own_files.push_back(f.port_file);
  SetWriteRoots({f.data_dir}, own_files);
  return absl::OkStatus();
}

// Set once the daemon's own start-up reads are done (the shipped multiplier tables live
// outside the data directory).
ReadPolicy ReadPolicyFor(const Flags& f, const ServiceOptions& service) {
  ReadPolicy policy;
  policy.roots = service.dataset_roots;
  policy.roots.push_back(f.data_dir);
  policy.max_file_bytes = static_cast<uint64_t>(f.max_file_bytes);
  return policy;
}

// The gRPC server with its bounds before authentication: request metadata (the token is
// ~100 bytes; an endless header block is cut off here), streams per connection, and the
// threads that serve calls (a sync server runs one per call; Watch streams are capped below
// that in the service). Null when it cannot listen.
std::unique_ptr<grpc::Server> StartServer(const Flags& f,
                                          std::shared_ptr<grpc::ServerCredentials> creds,
                                          const std::string& token, TopiaryService* service,
                                          int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeAuthInterceptorFactory(token));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.AddListeningPort(f.listen, creds, port);
  builder.SetMaxReceiveMessageSize(1 << 20);  // larger requests: RESOURCE_EXHAUSTED
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  grpc::ResourceQuota quota("topiaryd");
  quota.SetMaxThreads(kMaxServerThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  return server != nullptr && *port != 0 ? std::move(server) : nullptr;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  // --version is Abseil's own flag (defining another breaks static links); it prints this.
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return absl::StrCat("topiaryd ", kTopiaryVersion, "\n"); };
  absl::SetFlagsUsageConfig(usage);
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument '", rest[1], "'; see --help"));
  Flags f;
  if (auto st = CheckFlags(&f); !st.ok()) return Fail(std::string(st.message()));
  ServiceOptions service_options;
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (auto st = ReadCredentials(f, &service_options.token, &creds); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  service_options.topiary_binary =
      f.topiary_binary.empty() ? FindTopiaryBinary() : Canonical(f.topiary_binary);
  service_options.max_file_bytes = static_cast<uint64_t>(f.max_file_bytes);
  SchedulerOptions scheduler_options;
  ChooseDevices(f, &scheduler_options, &service_options);

  // SIGINT/SIGTERM are taken by sigwait below, in the main thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (auto st = SetFilePolicies(f, service_options); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  SeedMultiplierLibrary(f.data_dir + "/multipliers");
  // Uploads cut off by the last stop are dropped (server/file_transfer.h).
  if (auto st = ResetUploadStaging(f.data_dir); !st.ok()) {
    return Fail(absl::StrCat("--data_dir: ", st.message()));
  }
  Registry registry(f.data_dir, f.max_restarts);
  auto queued = registry.Load();
  // From here on every file read is checked: inside the data directory or the dataset
  // folders once links are followed, regular, and within --max_file_bytes.
  SetReadPolicy(ReadPolicyFor(f, service_options));
  if (!queued.ok()) return Fail(absl::StrCat("--data_dir: ", queued.status().message()));
  std::unique_ptr<Slurm> slurm;
  if (f.scheduler == "slurm") {
    SlurmOptions so;
    so.topiary_binary = service_options.topiary_binary;
    so.token_file = f.token_file.empty() ? "" : Canonical(f.token_file);
    so.tls_ca = f.tls_cert.empty() ? "" : Canonical(f.tls_cert);
    so.sbatch_args = absl::StrSplit(f.slurm_sbatch_args, ' ', absl::SkipEmpty());
    slurm = std::make_unique<Slurm>(std::move(so));
    scheduler_options.slurm = slurm.get();
    scheduler_options.cpu_slots = f.slurm_max_jobs;
    service_options.devices = {"slurm"};
  }
  auto scheduler = std::make_unique<Scheduler>(&registry, scheduler_options);
  TopiaryService service(&registry, scheduler.get(), service_options);
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      StartServer(f, creds, service_options.token, &service, &port);
  if (server == nullptr) return Fail(absl::StrCat("cannot listen on ", f.listen));
  if (!f.port_file.empty()) {
    if (auto st = WriteFileAtomic(f.port_file, absl::StrCat(port, "\n")); !st.ok()) {
      return Fail(absl::StrCat("--port_file: ", st.message()));
    }
  }
  if (slurm) {
    // Where the jobs report: the address given, else this host's name (a wildcard listen
    // address names no host) and the port.
    std::string host = f.listen.substr(0, f.listen.rfind(':'));
    if (host.empty() || host == "0.0.0.0" || host == "[::]") {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      host = name;
    }
    slurm->set_report_address(f.report_address.empty() ? absl::StrCat(host, ":", port)
                                                       : f.report_address);
  }
  scheduler->Start();
  for (const std::string& id : *queued) scheduler->Enqueue(id);
  const std::string host = f.listen.substr(0, f.listen.rfind(':'));
  absl::FPrintF(stderr, "topiaryd: listening on %s:%d%s, data in %s, %d slot(s) on %s\n", host,
                port, f.tls_cert.empty() ? "" : " (TLS)", f.data_dir, scheduler->slots(),
                absl::StrJoin(service_options.devices, ", "));
  int sig = 0;
  sigwait(&signals, &sig);
  absl::FPrintF(stderr, "topiaryd: stopping (signal %d); running experiments checkpoint\n", sig);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  scheduler.reset();  // pauses running experiments; they are queued again on the next start
  return 0;
}

}  // namespace
}  // namespace topiary::server

int main(int argc, char** argv) { return topiary::server::Main(argc, argv); }
