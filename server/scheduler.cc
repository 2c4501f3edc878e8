#include "server/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "pruning/pruner.h"
#include "trainer/core/device.h"
#include "trainer/run/runner.h"
#include "trainer/util/file_util.h"

namespace topiary::server {

Scheduler::Scheduler(Registry* registry, SchedulerOptions options)
    : registry_(registry),
      options_(std::move(options)),
      placement_(options_.gpus, options_.cpu_slots) {}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // A daemon shutting down pauses what runs, so it resumes on the next start.
    for (const auto& [id, thread] : runs_) registry_->RequestStop(id, RunControl::Stop::kPause);
  }
  wake_.SignalAll();
  if (dispatcher_.joinable()) dispatcher_.join();
  std::map<std::string, std::thread> runs;
  {
    absl::MutexLock lock(&mu_);
    runs.swap(runs_);
  }
  for (auto& [id, thread] : runs) thread.join();
}

void Scheduler::Start() {
  dispatcher_ = std::thread([this] { Dispatch(); });
}

void Scheduler::Enqueue(const std::string& id) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(id);
  wake_.SignalAll();
}

bool Scheduler::Dequeue(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(queue_.begin(), queue_.end(), id);
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

absl::Status Scheduler::Feasible(const topiary::v1::ExperimentSpec& spec) const {
  absl::MutexLock lock(&mu_);
  if (options_.slurm != nullptr) return absl::OkStatus();  // Slurm's sbatch judges it
  const Need need = placement_.NeedOf(spec);
  if (absl::Status st = placement_.Feasible(need); !st.ok()) return st;
  // A CPU run asks this machine for its threads: no more than it can start.
  return need.cpu ? CheckCpuThreads(spec.device()) : absl::OkStatus();
}

int Scheduler::slots() const {
  absl::MutexLock lock(&mu_);
  return options_.gpus.empty() ? placement_.cpu_slots() : static_cast<int>(options_.gpus.size());
}

int Scheduler::running() const {
  absl::MutexLock lock(&mu_);
  return placement_.running();
}

int Scheduler::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

std::vector<std::pair<int, std::string>> Scheduler::Occupancy() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<int, std::string>> out;
  for (size_t i = 0; i < placement_.gpus().size(); ++i) {
    out.emplace_back(placement_.gpus()[i], placement_.occupants()[i]);
  }
  return out;
}

absl::StatusOr<Need> Scheduler::NeedFor(topiary::v1::DeviceSpec::Kind kind) const {
  absl::MutexLock lock(&mu_);
  if (kind == topiary::v1::DeviceSpec::CUDA && placement_.gpus().empty()) {
    return absl::FailedPreconditionError(
        "the work runs on CUDA and this daemon schedules no GPU; ask for the CPU (--device cpu)");
  }
  topiary::v1::ExperimentSpec spec;
  spec.mutable_device()->set_kind(kind);
  Need need = placement_.NeedOf(spec);
  if (auto st = placement_.Feasible(need); !st.ok()) return st;
  return need;
}

std::optional<std::vector<int>> Scheduler::Lease(const std::string& holder, const Need& need,
                                                 const std::function<bool()>& cancelled,
                                                 const std::function<void(int)>& waiting) {
  mu_.Lock();
  leases_[holder] = PendingLease{need, std::nullopt};
  queue_.push_back(holder);
  wake_.SignalAll();
  bool waited = false;  // a lease granted at once says nothing
  while (!leases_[holder].granted) {
    const auto at = std::find(queue_.begin(), queue_.end(), holder);
    const int ahead = static_cast<int>(at - queue_.begin());
    mu_.Unlock();
    const bool give_up = cancelled();
    if (!give_up && waiting && waited) waiting(ahead);
    mu_.Lock();
    if (leases_[holder].granted) break;
    if (give_up || stopping_) {
      queue_.erase(std::remove(queue_.begin(), queue_.end(), holder), queue_.end());
      leases_.erase(holder);
      wake_.SignalAll();  // the one behind it may start now
      mu_.Unlock();
      return std::nullopt;
    }
    wake_.WaitWithTimeout(&mu_, absl::Seconds(1));
    waited = true;
  }
  std::vector<int> gpus = *leases_[holder].granted;
  leases_.erase(holder);
  mu_.Unlock();
  return gpus;
}

void Scheduler::EndLease(const std::string& holder) {
  absl::MutexLock lock(&mu_);
  placement_.Release(holder);
  wake_.SignalAll();
}

void Scheduler::Dispatch() {
  absl::MutexLock lock(&mu_);
  while (true) {
    for (const std::string& id : finished_) {
      auto it = runs_.find(id);
      if (it == runs_.end()) continue;
      it->second.join();  // it has returned, or is about to: it released under this lock
      runs_.erase(it);
    }
    finished_.clear();
    if (stopping_) return;
    bool started = false;
    if (!queue_.empty()) {
      const std::string id = queue_.front();
      if (auto lease = leases_.find(id); lease != leases_.end()) {
        // A lease at the head: granted when what it needs is free (its waiter wakes).
        if (auto gpus = placement_.TryTake(id, lease->second.need)) {
          queue_.pop_front();
          lease->second.granted = *gpus;
          wake_.SignalAll();
          continue;
        }
        wake_.Wait(&mu_);
        continue;
      }
      // Queued again (a Resume, a pause withdrawn) before its previous run's thread was
      // joined: that thread releases its GPUs and is joined first (one thread per id).
      if (runs_.count(id) != 0) {
        wake_.Wait(&mu_);
        continue;
      }
      auto record = registry_->Get(id);
      if (!record.ok() || record->state() != topiary::v1::QUEUED) {
        queue_.pop_front();  // gone, or no longer waiting
        continue;
      }
      const Need need = NeedOf(record->spec());
      if (absl::Status st = placement_.Feasible(need); !st.ok()) {
        // Queued by an earlier daemon with other GPUs (kept across restarts).
        queue_.pop_front();
        if (auto failed = registry_->Transition(id, {topiary::v1::QUEUED}, topiary::v1::FAILED,
                                                std::string(st.message()), "place");
            !failed.ok()) {
          std::fprintf(stderr, "topiaryd: %s\n", std::string(failed.status().message()).c_str());
        }
        continue;
      }
      if (auto gpus = placement_.TryTake(id, need)) {
        queue_.pop_front();
        runs_[id] = std::thread([this, id, granted = *gpus] {
          const bool again = Run(id, granted);
          if (options_.after_run) options_.after_run(id);
          absl::MutexLock lock(&mu_);
          placement_.Release(id);
          finished_.push_back(id);
          if (again) queue_.push_back(id);
          wake_.SignalAll();
        });
        started = true;
      }
    }
    if (!started) wake_.Wait(&mu_);
  }
}

Need Scheduler::NeedOf(const topiary::v1::ExperimentSpec& spec) const {
  if (options_.slurm != nullptr) return Need{true, 0, {}};
  return placement_.NeedOf(spec);
}

bool Scheduler::Run(const std::string& id, const std::vector<int>& gpus) {
  auto record = registry_->Get(id);
  if (!record.ok() || record->state() != topiary::v1::QUEUED) return false;
  topiary::v1::ExperimentSpec spec = record->spec();
  if (!gpus.empty()) {  // the GPUs placement granted, whatever the spec asked
    spec.mutable_device()->clear_gpus();
    spec.mutable_device()->clear_gpu_count();
    for (int g : gpus) spec.mutable_device()->add_gpus(g);
  }
  const std::string resume = record->last_checkpoint();
  if (absl::Status st =
          registry_->SetState(id, topiary::v1::RUNNING,
                              resume.empty() ? "started" : absl::StrCat("resuming from ", resume));
      !st.ok()) {
    // Not started: a run the record does not know of would start again after a restart.
    registry_->FinishRun(id, topiary::v1::FAILED, absl::StrCat("cannot start: ", st.message()),
                         false);
    return false;
  }
  if (options_.slurm != nullptr) {
    const topiary::v1::RunSummary summary =
        RunOnSlurm(id, spec, resume.empty() ? "" : registry_->data_dir() + "/" + resume, "");
    absl::MutexLock lock(&mu_);
    return registry_->FinishRun(id, summary.state(), summary.error(), stopping_);
  }
  std::unique_ptr<RunControl> control = registry_->ControlFor(id);
  RunOptions options;
  options.out_dir = registry_->Folder(id);
  options.experiment_id = id;
  options.write_event_log = false;  // the registry keeps the experiment's log
  options.progress_interval_s = options_.progress_interval_s;
  options.make_pruner = pruning::MakePruner;
  options.control = control.get();
  if (!resume.empty()) options.resume_from = registry_->data_dir() + "/" + resume;
  options.on_event = [&](const Event& e) { registry_->AppendRunEvent(id, e); };
  const topiary::v1::RunSummary summary = RunExperiment(spec, options);
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
  }
  // A daemon that is stopping queues its paused runs again, so the next start resumes them.
  return registry_->FinishRun(id, summary.state(), summary.error(), stopping);
}

topiary::v1::RunSummary Scheduler::RunOnSlurm(const std::string& id,
                                              const topiary::v1::ExperimentSpec& spec,
                                              const std::string& resume, std::string job) {
  topiary::v1::RunSummary summary;
  summary.set_state(topiary::v1::FAILED);
  auto before = registry_->Get(id);
  const uint32_t first_seq = before.ok() ? before->last_seq() : 0;
  // A daemon that died while the experiment's job ran finds the job still in Slurm's queue
  // and follows it, instead of starting a second one on the same folder.
  if (job.empty() && before.ok() && !before->slurm_job_id().empty()) {
    auto state = options_.slurm->State(before->slurm_job_id());
    if (state.ok() && SlurmJobActive(*state)) {
      job = before->slurm_job_id();
      std::fprintf(stderr, "topiaryd: %s: following its Slurm job %s again\n", id.c_str(),
                   job.c_str());
    }
  }
  if (job.empty()) {
    SlurmJob j;
    j.experiment_id = id;
    j.folder = registry_->Folder(id);
    j.resume_from = resume;
    j.spec = spec;
    auto submitted = options_.slurm->Submit(j);
    if (!submitted.ok()) {
      summary.set_error(absl::StrCat("slurm: ", submitted.status().message()));
      return summary;
    }
    job = *submitted;
    (void)registry_->Update(id, [&](topiary::v1::Experiment* e) {
      e->set_slurm_job_id(job);
      e->set_device("slurm job " + job);
    });
  }
  // Follow the job: the registry's stop requests become signals (once each), and Slurm's
  // queue says when it has ended.
  std::unique_ptr<RunControl> control = registry_->ControlFor(id);
  bool paused = false, cancelled = false;
  absl::Time cancelled_at = absl::InfiniteFuture();
  std::string state, last_state;
  int misses = 0;
  while (true) {
    const RunControl::Stop stop = control ? control->ShouldStop() : RunControl::Stop::kNone;
    if (stop == RunControl::Stop::kPause && !paused && !cancelled) {
      paused = options_.slurm->Signal(job, "USR1").ok();
    } else if (stop == RunControl::Stop::kCancel && !cancelled) {
      cancelled = options_.slurm->Signal(job, "TERM").ok();
      cancelled_at = absl::Now();
    } else if (cancelled && absl::Now() - cancelled_at > absl::Seconds(60)) {
      // Tasks that do not stop for TERM within a minute: Slurm ends the job (TERM, then KILL).
      (void)options_.slurm->Cancel(job);
      cancelled_at = absl::InfiniteFuture();
    }
    auto now = options_.slurm->State(job);
    if (now.ok()) {
      misses = 0;
      if (!now->empty()) last_state = *now;
      if (!SlurmJobActive(*now)) break;
    } else if (++misses > 60) {  // Slurm unreachable for a minute
      summary.set_error(absl::StrCat("slurm: job ", job, ": ", now.status().message()));
      return summary;
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
  // Rank 0's summary, the last event it reported (the report precedes its exit).
  bool done = false;
  for (const Event& e :
       registry_->EventsAfter(id, first_seq, std::chrono::milliseconds(0), &done)) {
    if (e.has_summary()) summary = e.summary();
  }
  if (summary.state() == topiary::v1::FAILED && summary.error().empty()) {
    std::string tail;
    if (auto out = ReadFile(absl::StrCat(registry_->Folder(id), "/slurm/job-", job, ".out"));
        out.ok()) {
      tail = out->substr(out->size() > 600 ? out->size() - 600 : 0);
    }
    summary.set_error(absl::StrCat("slurm job ", job, " ended ",
                                   last_state.empty() ? "(no longer known)" : last_state,
                                   " without rank 0's summary (a task died or was killed); its "
                                   "output ends: ",
                                   tail));
  }
  return summary;
}

}  // namespace topiary::server
