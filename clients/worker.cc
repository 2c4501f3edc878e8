#include "clients/worker.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace topiary {
namespace {

// A flag, else the variable, else nullopt; INVALID_ARGUMENT when the variable is not an int.
absl::StatusOr<std::optional<int>> FlagOrEnv(const std::optional<int>& flag, const char* name,
                                             const std::function<const char*(const char*)>& env) {
  if (flag) return flag;
  const char* text = env(name);
  if (text == nullptr) return std::optional<int>();
  int v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": '", text, "' is not a number"));
  }
  return std::optional<int>(v);
}

std::atomic<int> g_stop{0};  // RunControl::Stop, set by the handlers

void OnSignal(int sig) {
  const int stop =
      static_cast<int>(sig == SIGUSR1 ? RunControl::Stop::kPause : RunControl::Stop::kCancel);
  if (stop > g_stop.load()) g_stop.store(stop);
}

}  // namespace

absl::StatusOr<World> ResolveWorld(const WorkerFlags& flags,
                                   const std::function<const char*(const char*)>& env) {
  auto rank = FlagOrEnv(flags.rank, "SLURM_PROCID", env);
  auto size = FlagOrEnv(flags.world, "SLURM_NTASKS", env);
  auto local = FlagOrEnv(flags.local_rank, "SLURM_LOCALID", env);
  for (const auto* st : {&rank, &size, &local}) {
    if (!st->ok()) return st->status();
  }
  if (!rank->has_value() || !size->has_value()) {
    return absl::InvalidArgumentError(
        "worker: give --rank and --world (or run it under Slurm's srun, which sets "
        "SLURM_PROCID and SLURM_NTASKS)");
  }
  World w;
  w.rank = **rank;
  w.size = **size;
  w.local_rank = local->value_or(0);
  if (w.size < 1 || w.size > 4096) {
    return absl::InvalidArgumentError(absl::StrFormat("--world: %d is not in [1, 4096]", w.size));
  }
  if (w.rank < 0 || w.rank >= w.size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--rank: %d is not in [0, %d) (the world's size)", w.rank, w.size));
  }
  if (w.local_rank < 0 || w.local_rank >= 4096) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--local_rank: %d is negative or too large", w.local_rank));
  }
  w.rendezvous = flags.rendezvous;
  if (w.rendezvous.empty() && w.size > 1) {
    const char* job = env("SLURM_JOB_ID");
    const char* step = env("SLURM_STEP_ID");
    if (job == nullptr || flags.out.empty()) {
      return absl::InvalidArgumentError(
          "--rendezvous: a fresh directory every process reaches (or run under Slurm with "
          "--out on shared storage)");
    }
    w.rendezvous = absl::StrCat(flags.out, "/rendezvous/job", job, ".", step ? step : "0");
  }
  return w;
}

EventReporter::EventReporter(const Args& a, std::string slurm_job_id)
    : connection_(a), experiment_(a.experiment), job_(std::move(slurm_job_id)) {}

bool EventReporter::Flush() {
  topiary::v1::ReportRunEventsRequest req;
  req.set_experiment_id(experiment_);
  req.set_slurm_job_id(job_);
  for (const auto& e : pending_) *req.add_events() = e;
  topiary::v1::ReportRunEventsResponse resp;
  auto ctx = connection_.Context();
  const grpc::Status st = connection_.stub().ReportRunEvents(ctx.get(), req, &resp);
  if (!st.ok()) {
    absl::FPrintF(stderr, "topiary worker: reporting to %s: %s\n", connection_.address(),
                  st.error_message());
    return false;
  }
  const uint32_t acked = resp.acknowledged_seq();
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const topiary::v1::Event& e) { return e.seq() <= acked; }),
                 pending_.end());
  return pending_.empty();
}

void EventReporter::Send(const topiary::v1::Event& e) {
  pending_.push_back(e);
  if (pending_.size() > 10000) pending_.erase(pending_.begin());  // bounded while away
  if (Flush() || !e.has_summary()) return;
  for (int attempt = 0; attempt < 30 && !Flush(); ++attempt) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
}

SignalControl::SignalControl() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGUSR1, SIGTERM, SIGINT}) sigaction(sig, &sa, nullptr);
}

RunControl::Stop SignalControl::ShouldStop() {
  return static_cast<RunControl::Stop>(g_stop.load());
}

}  // namespace topiary
