// RankGroup: the data-parallel ranks of one run in this process. Owns each rank's device and
// model, the threads that drive them (one per rank) and the collective between them, and
// keeps the models identical: rank 0's model is the run's (loaded, evaluated, pruned,
// checkpointed) and the other ranks copy it after each change. One rank: no threads, no
// collective. In a world of processes (topiary worker) the group is this process's one rank
// of the world, and the collective spans the processes.
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
  // world.multi(): one device, this process's rank of the world; the others must arrive
  // within timeout_s.
  static absl::StatusOr<std::unique_ptr<RankGroup>> Create(
      std::vector<std::unique_ptr<Device>> devices, bool deterministic, const World& world = {},
      double timeout_s = 300);

  // This process's ranks.
  int size() const { return static_cast<int>(devices_.size()); }
  // Every process's: the ranks sharing the global batch.
  int world_size() const { return world_.multi() ? world_.size : size(); }
  // The global rank of this process's rank r.
  int global_rank(int r) const { return world_.rank + r; }
  // Whether this process writes the run's files and events (it holds global rank 0).
  bool leads() const { return world_.rank == 0; }
  const World& world() const { return world_; }
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
  // Rank 0's parameters, momentum and masks copied to the other ranks (across processes:
  // values and momentum broadcast; every process prunes alike, and CheckIdentical compares
  // masks).
  absl::Status Replicate();
  // OK when every rank's model equals rank 0's bit for bit (across processes: by checksums);
  // otherwise INTERNAL naming the rank and the first difference ("not writing `what`").
  absl::Status CheckIdentical(const std::string& what) const;

 private:
  RankGroup() = default;

  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Model>> models_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<RankThreads> threads_;
  World world_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_RANK_GROUP_H_
