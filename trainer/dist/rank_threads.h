// RankThreads: one thread per data-parallel rank, each bound to its rank's device (CUDA's
// current device is per thread), running the same function for every rank at once. Rank 0
// runs on the calling thread; a single rank needs no thread at all.
#ifndef TOPIARY_TRAINER_DIST_RANK_THREADS_H_
#define TOPIARY_TRAINER_DIST_RANK_THREADS_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "trainer/core/device.h"

namespace topiary {

class RankThreads {
 public:
  // on_error: called (from the failing rank's thread) as soon as a rank fails, so that ranks
  // waiting for it in a collective stop waiting (Collective::Abort).
  RankThreads(std::vector<Device*> devices, std::function<void()> on_error);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int ranks() const { return static_cast<int>(devices_.size()); }
  // Runs fn(rank) for every rank, each on its thread, and returns when all have returned:
  // the lowest rank's error, or OK.
  absl::Status Run(const std::function<absl::Status(int rank)>& fn);

 private:
  void Work(int rank);

  std::vector<Device*> devices_;
  std::function<void()> on_error_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  const std::function<absl::Status(int)>* task_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_RANK_THREADS_H_
