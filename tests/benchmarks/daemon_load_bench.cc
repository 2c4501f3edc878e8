// Control-plane load on topiaryd while it trains: N clients making unary calls (Get, List,
// GetServerInfo, ListCheckpoints in turn) and W watchers streaming the running experiment's
// events, for a fixed time. Reports errors and the unary latency distribution.
//
//   daemon_load_bench --server ADDR --spec SPEC [--clients 50] [--watchers 20] [--seconds 20]
//
// The experiment in SPEC is submitted first (it should run longer than --seconds) and
// cancelled at the end.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "topiary/v1/service.grpc.pb.h"
#include "trainer/spec/spec.h"

namespace topiary {
namespace {

using Clock = std::chrono::steady_clock;

int Main(int argc, char** argv) {
  std::string server = "127.0.0.1:7077", spec_path;
  int clients = 50, watchers = 20, seconds = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--server") server = v;
    if (f == "--spec") spec_path = v;
    if (f == "--clients") clients = std::atoi(v.c_str());
    if (f == "--watchers") watchers = std::atoi(v.c_str());
    if (f == "--seconds") seconds = std::atoi(v.c_str());
  }
  auto spec = LoadSpecFile(spec_path);
  if (!spec.ok()) {
    absl::FPrintF(stderr, "--spec: %s\n", spec.status().message());
    return 2;
  }
  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  auto stub = topiary::v1::Topiary::NewStub(channel);
  topiary::v1::SubmitExperimentRequest submit;
  *submit.mutable_spec() = *spec;
  topiary::v1::Experiment exp;
  {
    grpc::ClientContext ctx;
    const grpc::Status st = stub->SubmitExperiment(&ctx, submit, &exp);
    if (!st.ok()) {
      absl::FPrintF(stderr, "submit: %s\n", st.error_message());
      return 1;
    }
  }
  const std::string id = exp.id();
  for (int i = 0; i < 600; ++i) {  // wait until it trains
    grpc::ClientContext ctx;
    topiary::v1::ExperimentRef ref;
    ref.set_id(id);
    if (stub->GetExperiment(&ctx, ref, &exp).ok() && exp.state() == topiary::v1::RUNNING &&
        exp.last_seq() > 3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const Clock::time_point end = Clock::now() + std::chrono::seconds(seconds);
  std::atomic<int64_t> errors{0}, events{0};
  std::mutex mu;
  std::vector<double> latencies_ms;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      // Each client has its own channel, as separate processes would.
      auto own = topiary::v1::Topiary::NewStub(
          grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
      std::vector<double> mine;
      topiary::v1::ExperimentRef ref;
      ref.set_id(id);
      for (int n = c; Clock::now() < end; ++n) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        const Clock::time_point t0 = Clock::now();
        grpc::Status st;
        switch (n % 4) {
          case 0: {
            topiary::v1::Experiment e;
            st = own->GetExperiment(&ctx, ref, &e);
            break;
          }
          case 1: {
            topiary::v1::ListExperimentsResponse r;
            st = own->ListExperiments(&ctx, topiary::v1::ListExperimentsRequest(), &r);
            break;
          }
          case 2: {
            topiary::v1::ServerInfo r;
            st = own->GetServerInfo(&ctx, topiary::v1::GetServerInfoRequest(), &r);
            break;
          }
          default: {
            topiary::v1::ListCheckpointsResponse r;
            st = own->ListCheckpoints(&ctx, ref, &r);
          }
        }
        mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (!st.ok()) ++errors;
      }
      std::lock_guard<std::mutex> lock(mu);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
    });
  }
  for (int w = 0; w < watchers; ++w) {
    threads.emplace_back([&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
      topiary::v1::WatchExperimentRequest req;
      req.set_id(id);
      auto reader = stub->WatchExperiment(&ctx, req);
      topiary::v1::Event e;
      while (reader->Read(&e)) ++events;
      const grpc::Status st = reader->Finish();
      // The deadline ends a watch of a still-running experiment; anything else is an error.
      if (!st.ok() && st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) ++errors;
    });
  }
  for (std::thread& t : threads) t.join();
  {
    grpc::ClientContext ctx;
    topiary::v1::ExperimentRef ref;
    ref.set_id(id);
    (void)stub->CancelExperiment(&ctx, ref, &exp);
  }
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double p) {
    return latencies_ms.empty()
               ? 0.0
               : latencies_ms[std::min(latencies_ms.size() - 1,
                                       static_cast<size_t>(p * latencies_ms.size()))];
  };
  absl::PrintF(
      "%d clients + %d watchers for %d s while %s trains: %d unary calls (%.0f/s), %d events "
      "streamed, %d errors\nlatency ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n",
      clients, watchers, seconds, id, latencies_ms.size(), latencies_ms.size() / double(seconds),
      events.load(), errors.load(), pct(0.5), pct(0.9), pct(0.99),
      latencies_ms.empty() ? 0.0 : latencies_ms.back());
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace topiary

int main(int argc, char** argv) { return topiary::Main(argc, argv); }
