// The scheduler: a FIFO queue of experiments and one worker per slot. By default one slot
// per GPU (each worker pins its experiments to its GPU), or one CPU slot when there is no
// GPU. A worker runs an experiment in its own thread through trainer's RunExperiment with
// the registry's RunControl, and records how it ended.
#ifndef TOPIARY_SERVER_SCHEDULER_H_
#define TOPIARY_SERVER_SCHEDULER_H_

#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/registry.h"

namespace topiary::server {

struct SchedulerOptions {
  std::vector<int> gpus;  // one slot per GPU ordinal; empty: CPU slots
  int cpu_slots = 1;      // slots when there is no GPU
  double progress_interval_s = 1.0;
};

class Scheduler {
 public:
  Scheduler(Registry* registry, SchedulerOptions options);
  ~Scheduler();  // stops taking work and waits for the workers' current runs to pause

  void Start();
  void Enqueue(const std::string& id);
  // Removes a queued experiment (pause or cancel before it started); false if not queued.
  bool Dequeue(const std::string& id);
  int slots() const { return static_cast<int>(workers_.size()); }
  int running() const;
  int queued() const;

 private:
  void Work(int slot);
  void Run(int slot, const std::string& id);

  Registry* registry_;
  SchedulerOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // work was queued, or the scheduler is stopping
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> current_ ABSL_GUARDED_BY(mu_);  // per slot; empty when idle
  std::vector<std::thread> workers_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_SCHEDULER_H_
