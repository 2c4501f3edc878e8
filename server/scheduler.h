// The scheduler: a FIFO queue of experiments placed on GPU sets (server/placement.h). A
// dispatcher thread starts the experiment at the head of the queue as soon as the GPUs (or
// CPU slot) it needs are free, each in its own thread through trainer's RunExperiment with
// the registry's RunControl and the GPUs it was granted, and records how it ended.
#ifndef TOPIARY_SERVER_SCHEDULER_H_
#define TOPIARY_SERVER_SCHEDULER_H_

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/placement.h"
#include "server/registry.h"
#include "server/slurm.h"

namespace topiary::server {

struct SchedulerOptions {
  std::vector<int> gpus;  // the GPU ordinals to schedule; empty: CPU slots only
  int cpu_slots = 1;      // experiments running on the CPU at once
  double progress_interval_s = 1.0;
  // Called in a run's thread after the run has ended and before it gives its GPUs back
  // (tests widen that window with it); may be empty.
  std::function<void(const std::string& id)> after_run;
  // topiaryd --scheduler slurm: every experiment becomes a Slurm job as soon as it is queued
  // (Slurm's queue places it; cpu_slots bounds the jobs in flight); null: runs in this
  // process on the GPUs above.
  const Slurm* slurm = nullptr;
};

class Scheduler {
 public:
  Scheduler(Registry* registry, SchedulerOptions options);
  ~Scheduler();  // stops taking work and waits for the current runs to pause

  void Start();
  void Enqueue(const std::string& id);
  // Removes a queued experiment (pause or cancel before it started); false if not queued.
  bool Dequeue(const std::string& id);
  // OK when this daemon could ever run `spec` (enough GPUs, the ordinals it names; on the CPU,
  // no more threads than this machine allows: CheckCpuThreads).
  absl::Status Feasible(const topiary::v1::ExperimentSpec& spec) const;
  // Experiments that can run at once: GPUs, or CPU slots on a daemon without GPUs.
  int slots() const;
  int running() const;
  int queued() const;
  // Per scheduled GPU: (ordinal, experiment id or "").
  std::vector<std::pair<int, std::string>> Occupancy() const;

  // A device for work that is not an experiment (a remote evaluate or sensitivity): it waits
  // in the experiments' queue (first in, first out) under the name `holder`, and holds what it
  // was granted until EndLease. Returns the GPU ordinals granted (empty: a CPU slot), or
  // nullopt when `cancelled` turned true while it waited, or the daemon is stopping.
  // `waiting(ahead)` is called about once a second while it waits (not under the lock).
  // REQUIRES: placement's Feasible(need) (see FeasibleNeed).
  std::optional<std::vector<int>> Lease(const std::string& holder, const Need& need,
                                        const std::function<bool()>& cancelled,
                                        const std::function<void(int ahead)>& waiting);
  void EndLease(const std::string& holder);
  // What a device kind needs here (one GPU, or a CPU slot), and whether it can be had.
  absl::StatusOr<Need> NeedFor(topiary::v1::DeviceSpec::Kind kind) const;

 private:
  void Dispatch();
  // Runs `id` on `gpus` to its end; true when it must be queued again (a Resume that came
  // while it paused), which its thread does once it has released the GPUs.
  bool Run(const std::string& id, const std::vector<int>& gpus);
  // The Slurm job of `id` (submitted now, or `job` when a restarted daemon follows one) to its
  // end: pause and cancel become signals, the state the summary rank 0 reported, or FAILED
  // saying how the job ended without one.
  topiary::v1::RunSummary RunOnSlurm(const std::string& id, const topiary::v1::ExperimentSpec& spec,
                                     const std::string& resume, std::string job);
  // What `spec` needs here: a CPU slot for every Slurm job.
  Need NeedOf(const topiary::v1::ExperimentSpec& spec) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Registry* registry_;
  SchedulerOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // queued work, freed GPUs, a finished run, or stopping
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  Placement placement_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::thread> runs_ ABSL_GUARDED_BY(mu_);
  // Leases waiting in queue_ (by holder): their need, and once granted, the GPUs.
  struct PendingLease {
    Need need;
    std::optional<std::vector<int>> granted;
  };
  std::map<std::string, PendingLease> leases_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> finished_ ABSL_GUARDED_BY(mu_);  // runs to join
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread dispatcher_;
};

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_SCHEDULER_H_
