// topiaryd: the Topiary daemon. Serves topiary.v1.Topiary (plus grpc.health.v1 and server
// reflection) and runs the submitted experiments on the GPUs (one at a time per GPU) or the
// CPU. See `topiaryd --help`.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/registry.h"
#include "server/scheduler.h"
#include "server/service.h"
#include "trainer/device.h"
#include "trainer/file_util.h"

namespace topiary::server {
namespace {

constexpr char kUsage[] = R"(topiaryd: the Topiary daemon (gRPC service topiary.v1.Topiary)

Usage: topiaryd [flags]
  --listen ADDR        address to serve on (default 127.0.0.1:7077; port 0 picks a free one).
                       A non-loopback address needs --token_file.
  --data_dir DIR       experiments, event logs and checkpoints (default
                       $XDG_DATA_HOME/topiary or ~/.local/share/topiary)
  --gpus LIST          GPU ordinals to use, e.g. 0,1 (default: every GPU found; "none": CPU)
  --max_running N      experiments running at once without a GPU (default 1); with GPUs,
                       one per GPU
  --max_queued N       queued experiments accepted (default 256; more: RESOURCE_EXHAUSTED)
  --token_file FILE    require "authorization: Bearer <token>" with the token in FILE
  --tls_cert FILE --tls_key FILE
                       serve TLS with this certificate chain and private key (PEM)
  --port_file FILE     write the port actually listened on to FILE (for scripts)
  --help               this text

SIGINT/SIGTERM stop the daemon: running experiments checkpoint and resume on the next start.
After a crash (kill -9) the next start re-queues what was running from its last checkpoint.
)";

struct Flags {
  std::string listen = "127.0.0.1:7077", data_dir, gpus, token_file, tls_cert, tls_key, port_file;
  int max_running = 1, max_queued = 256;
};

bool IsLoopback(const std::string& addr) {
  const std::string host = addr.substr(0, addr.rfind(':'));
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1" ||
         host.rfind("127.", 0) == 0;
}

int Fail(const std::string& message) {
  absl::FPrintF(stderr, "topiaryd: %s\n", message);
  return 2;
}

int Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      absl::PrintF("%s", kUsage);
      return 0;
    }
    std::string value;
    std::string name = a;
    if (const size_t eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Fail(absl::StrCat(a, " needs a value\n\n", kUsage));
    }
    if (name == "--listen")
      f.listen = value;
    else if (name == "--data_dir")
      f.data_dir = value;
    else if (name == "--gpus")
      f.gpus = value;
    else if (name == "--token_file")
      f.token_file = value;
    else if (name == "--tls_cert")
      f.tls_cert = value;
    else if (name == "--tls_key")
      f.tls_key = value;
    else if (name == "--port_file")
      f.port_file = value;
    else if (name == "--max_running" && absl::SimpleAtoi(value, &f.max_running) &&
             f.max_running > 0) {
    } else if (name == "--max_queued" && absl::SimpleAtoi(value, &f.max_queued) &&
               f.max_queued > 0) {
    } else
      return Fail(absl::StrCat("bad flag ", a, "\n\n", kUsage));
  }
  if (f.data_dir.empty()) {
    const char* xdg = std::getenv("XDG_DATA_HOME");
    const char* home = std::getenv("HOME");
    f.data_dir = xdg ? absl::StrCat(xdg, "/topiary")
                     : absl::StrCat(home ? home : ".", "/.local/share/topiary");
  }
  ServiceOptions service_options;
  if (!f.token_file.empty()) {
    auto token = ReadFile(f.token_file);
    if (!token.ok()) return Fail(absl::StrCat("--token_file: ", token.status().message()));
    service_options.token = std::string(absl::StripAsciiWhitespace(*token));
    if (service_options.token.empty()) return Fail("--token_file: the file is empty");
  }
  if (!IsLoopback(f.listen) && service_options.token.empty()) {
    return Fail(absl::StrCat("--listen ", f.listen,
                             " is not a loopback address: refusing to serve without "
                             "--token_file (anyone who can reach it could run code paths on "
                             "this machine's GPUs and read its checkpoints)"));
  }
  if (f.tls_cert.empty() != f.tls_key.empty()) return Fail("--tls_cert and --tls_key go together");

  // Devices: slots per GPU, or CPU slots.
  SchedulerOptions scheduler_options;
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
        scheduler_options.gpus.push_back(g.ordinal);
        service_options.devices.push_back(absl::StrCat("cuda:", g.ordinal, " ", g.name));
      }
    }
  }
  scheduler_options.cpu_slots = f.max_running;
  if (scheduler_options.gpus.empty()) service_options.devices.push_back("cpu");
  service_options.max_queued = f.max_queued;

  // SIGINT/SIGTERM are taken by sigwait below, in the main thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Registry registry(f.data_dir);
  auto queued = registry.Load();
  if (!queued.ok()) return Fail(absl::StrCat("--data_dir: ", queued.status().message()));
  auto scheduler = std::make_unique<Scheduler>(&registry, scheduler_options);
  TopiaryService service(&registry, scheduler.get(), service_options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!f.tls_cert.empty()) {
    auto cert = ReadFile(f.tls_cert);
    auto key = ReadFile(f.tls_key);
    if (!cert.ok() || !key.ok()) return Fail("--tls_cert/--tls_key: cannot read the files");
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(f.listen, creds, &port);
  builder.SetMaxReceiveMessageSize(1 << 20);  // larger requests: RESOURCE_EXHAUSTED
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return Fail(absl::StrCat("cannot listen on ", f.listen));
  if (!f.port_file.empty()) (void)WriteFileAtomic(f.port_file, absl::StrCat(port, "\n"));
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
