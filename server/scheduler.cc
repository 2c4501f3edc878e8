#include "server/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pruning/pruner.h"
#include "server/tensorboard.h"
#include "trainer/run/runner.h"

namespace topiary::server {

Scheduler::Scheduler(Registry* registry, SchedulerOptions options)
    : registry_(registry), options_(std::move(options)) {}

Scheduler::~Scheduler() {
  std::vector<std::string> running;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    running = current_;
  }
  // A daemon shutting down pauses what runs, so it resumes on the next start.
  for (const std::string& id : running) {
    if (!id.empty()) registry_->RequestStop(id, RunControl::Stop::kPause);
  }
  wake_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

void Scheduler::Start() {
  const int slots = options_.gpus.empty() ? std::max(1, options_.cpu_slots)
                                          : static_cast<int>(options_.gpus.size());
  {
    absl::MutexLock lock(&mu_);
    current_.assign(slots, "");
  }
  for (int i = 0; i < slots; ++i) workers_.emplace_back([this, i] { Work(i); });
}

void Scheduler::Enqueue(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(id);
  }
  wake_.Signal();
}

bool Scheduler::Dequeue(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(queue_.begin(), queue_.end(), id);
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

int Scheduler::running() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(current_.begin(), current_.end(),
                                        [](const std::string& s) { return !s.empty(); }));
}

int Scheduler::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

void Scheduler::Work(int slot) {
  while (true) {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) wake_.Wait(&mu_);
      if (stopping_) return;
      id = queue_.front();
      queue_.pop_front();
      current_[slot] = id;
    }
    Run(slot, id);
    absl::MutexLock lock(&mu_);
    current_[slot].clear();
  }
}

void Scheduler::Run(int slot, const std::string& id) {
  auto record = registry_->Get(id);
  if (!record.ok() || record->state() != topiary::v1::QUEUED) return;
  topiary::v1::ExperimentSpec spec = record->spec();
  if (!options_.gpus.empty() && spec.device().kind() != topiary::v1::DeviceSpec::CPU) {
    spec.mutable_device()->clear_gpus();
    spec.mutable_device()->add_gpus(options_.gpus[slot]);
  }
  const std::string resume = record->last_checkpoint();
  (void)registry_->SetState(id, topiary::v1::RUNNING,
                            resume.empty() ? "started" : absl::StrCat("resuming from ", resume));
  std::unique_ptr<RunControl> control = registry_->ControlFor(id);
  RunOptions options;
  options.out_dir = registry_->Folder(id);
  options.write_event_log = false;  // the registry keeps the experiment's log
  options.progress_interval_s = options_.progress_interval_s;
  options.make_pruner = pruning::MakePruner;
  options.control = control.get();
  if (!resume.empty()) options.resume_from = registry_->data_dir() + "/" + resume;
  TensorBoardWriter tensorboard(registry_->Folder(id) + "/tensorboard");
  options.on_event = [&](const Event& e) {
    tensorboard.Write(e);
    registry_->AppendRunEvent(id, e);
  };
  const topiary::v1::RunSummary summary = RunExperiment(spec, options);
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
  }
  // A daemon that is stopping queues its paused runs again, so the next start resumes them.
  if (registry_->FinishRun(id, summary.state(), summary.error(), stopping)) Enqueue(id);
}

}  // namespace topiary::server
