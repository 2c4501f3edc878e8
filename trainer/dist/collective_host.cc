// CPU ranks average through host memory: every rank publishes its array, each sums its own
// slice of all of them in rank order into a shared result, and every rank copies the result
// back (an all-gather copies every rank's array instead). Two barriers per operation; the next
// operation's first barrier keeps the result alive until every rank has copied it.
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kernels/elementwise/elementwise.h"
#include "trainer/dist/collective.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

class HostCollective : public Collective {
 public:
  explicit HostCollective(int ranks) : ranks_(ranks), arrays_(ranks, nullptr) {}
  int ranks() const override { return ranks_; }
  std::string name() const override { return "host"; }

  absl::Status Reserve(int rank, size_t n) override {
    absl::MutexLock lock(&mu_);
    if (n > result_.size()) result_.resize(n);
    return absl::OkStatus();
  }

  absl::Status AllReduceMean(int rank, float* data, size_t n) override {
    if (n > result_.size()) {
      return absl::InternalError(
          absl::StrFormat("all-reduce of %d floats exceeds the %d reserved", n, result_.size()));
    }
    arrays_[rank] = data;  // published by the barrier's lock
    TOPIARY_RETURN_IF_ERROR(Barrier());
    const size_t lo = n * rank / ranks_, hi = n * (rank + 1) / ranks_;
    std::vector<const float*> rows(ranks_);
    for (int r = 0; r < ranks_; ++r) rows[r] = static_cast<const float*>(arrays_[r]) + lo;
    kernels::MeanRowsCpu(ranks_, static_cast<int64_t>(hi - lo), rows.data(), result_.data() + lo);
    TOPIARY_RETURN_IF_ERROR(Barrier());
    std::memcpy(data, result_.data(), n * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status AllGather(int rank, const float* data, size_t n, float* all) override {
    return ExchangeHost(rank, data, n * sizeof(float), all);
  }

  // Two barriers: after the first every rank's array is published; after the second every
  // rank has copied them, so none is changed or freed while another still reads it.
  absl::Status ExchangeHost(int rank, const void* data, size_t n, void* all) override {
    arrays_[rank] = data;
    TOPIARY_RETURN_IF_ERROR(Barrier());
    for (int r = 0; r < ranks_; ++r) std::memcpy(static_cast<char*>(all) + r * n, arrays_[r], n);
    return Barrier();
  }

  absl::Status Broadcast(int rank, float* data, size_t n) override {
    arrays_[rank] = data;
    TOPIARY_RETURN_IF_ERROR(Barrier());
    if (rank != 0) std::memcpy(data, arrays_[0], n * sizeof(float));
    return Barrier();
  }

  void Abort() override {
    absl::MutexLock lock(&mu_);
    aborted_ = true;
    released_.SignalAll();
  }

 private:
  absl::Status Barrier() {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::AbortedError("another rank failed");
    const uint64_t generation = generation_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      ++generation_;
      released_.SignalAll();
      return absl::OkStatus();
    }
    while (!aborted_ && generation_ == generation) released_.Wait(&mu_);
    if (generation_ == generation) return absl::AbortedError("another rank failed");
    return absl::OkStatus();
  }

  const int ranks_;
  std::vector<const void*> arrays_;  // per rank, set before the first barrier of an operation
  std::vector<float> result_;        // sized by Reserve, before any operation
  absl::Mutex mu_;
  absl::CondVar released_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<Collective> MakeHostCollective(int ranks) {
  return std::make_unique<HostCollective>(ranks);
}

}  // namespace topiary
