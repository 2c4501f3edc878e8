// RankGroup: the data-parallel ranks of one run. Owns each rank's device and model, the
// threads that drive them (one per rank) and the collective between them, and keeps the
// models identical: rank 0's model is the run's (loaded, evaluated, pruned, checkpointed)
// and the other ranks copy it after each change. One rank: no threads, no collective.
#ifndef TOPIARY_TRAINER_DIST_RANK_GROUP_H_
#define TOPIARY_TRAINER_DIST_RANK_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/core/device.h"
#include "trainer/dist/collective.h"
#include "trainer/dist/rank_threads.h"
#include "trainer/nn/model.h"

namespace topiary {

class RankGroup {
 public:
  // One rank per device; more than one: NCCL between GPUs (`deterministic`: summed in rank
  // order), host memory between CPU ranks.
  static absl::StatusOr<std::unique_ptr<RankGroup>> Create(
      std::vector<std::unique_ptr<Device>> devices, bool deterministic);

  int size() const { return static_cast<int>(devices_.size()); }
  Device* device(int rank = 0) const { return devices_[rank].get(); }
  std::vector<Device*> devices() const;
  Model* model(int rank = 0) const { return models_[rank].get(); }
  void set_model(int rank, std::unique_ptr<Model> model) { models_[rank] = std::move(model); }
  // Null for one rank.
  Collective* collective() const { return collective_.get(); }
  // "cuda:0 (NVIDIA H100), cuda:1 (...)".
  std::string names() const;

  // Runs fn(rank) on every rank's thread at once (rank 0: this thread); the lowest rank's
  // error, or OK. A failing rank aborts the collective so that no rank waits forever.
  absl::Status Run(const std::function<absl::Status(int)>& fn) { return threads_->Run(fn); }
  // Rank 0's parameters, momentum and masks copied to the other ranks.
  absl::Status Replicate();
  // OK when every rank's model equals rank 0's bit for bit; otherwise INTERNAL naming the
  // rank and the first difference ("not writing `what`").
  absl::Status CheckIdentical(const std::string& what) const;

 private:
  RankGroup() = default;

  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Model>> models_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<RankThreads> threads_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_RANK_GROUP_H_
