#include "trainer/dist/rank_threads.h"

#include "absl/strings/str_cat.h"

namespace topiary {

RankThreads::RankThreads(std::vector<Device*> devices, std::function<void()> on_error)
    : devices_(std::move(devices)), on_error_(std::move(on_error)) {
  results_.resize(devices_.size());
  for (int r = 1; r < ranks(); ++r) threads_.emplace_back([this, r] { Work(r); });
}

RankThreads::~RankThreads() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status RankThreads::Run(const std::function<absl::Status(int)>& fn) {
  if (ranks() == 1) return fn(0);
  {
    absl::MutexLock lock(&mu_);
    task_ = &fn;
    ++generation_;
    pending_ = ranks() - 1;
    changed_.SignalAll();
  }
  absl::Status mine = fn(0);
  if (!mine.ok() && on_error_) on_error_();
  absl::MutexLock lock(&mu_);
  while (pending_ > 0) changed_.Wait(&mu_);
  task_ = nullptr;
  results_[0] = std::move(mine);
  // The cause, not a rank that stopped waiting for it (ABORTED), names the failure.
  for (bool aborted : {false, true}) {
    for (int r = 0; r < ranks(); ++r) {
      const absl::Status& st = results_[r];
      if (st.ok() || absl::IsAborted(st) != aborted) continue;
      if (r == 0) return st;
      return absl::Status(st.code(),
                          absl::StrCat("rank ", r, " (", devices_[r]->name(), "): ", st.message()));
    }
  }
  return absl::OkStatus();
}

void RankThreads::Work(int rank) {
  devices_[rank]->MakeCurrent();
  uint64_t seen = 0;
  while (true) {
    const std::function<absl::Status(int)>* task;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && generation_ == seen) changed_.Wait(&mu_);
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    absl::Status st = (*task)(rank);
    if (!st.ok() && on_error_) on_error_();
    absl::MutexLock lock(&mu_);
    results_[rank] = std::move(st);
    if (--pending_ == 0) changed_.SignalAll();
  }
}

}  // namespace topiary
