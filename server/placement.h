// Placement: which experiment holds which GPUs (or CPU slots). Pure bookkeeping, no threads,
// so the scheduler's rules are tested on machines without GPUs.
//
// An experiment needs the GPUs its spec names (device.gpus), or device.gpu_count of any
// free ones (default one), or, with device.kind CPU or on a daemon without GPUs, one CPU
// slot. The queue is first in, first out: the experiment at its head waits until what it
// needs is free, and nothing behind it starts before it (a large request is never starved
// by a stream of small ones), while running experiments go on.
#ifndef TOPIARY_SERVER_PLACEMENT_H_
#define TOPIARY_SERVER_PLACEMENT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "topiary/v1/experiment.pb.h"

namespace topiary::server {

struct Need {
  bool cpu = false;
  int count = 0;              // GPUs
  std::vector<int> ordinals;  // exact GPUs (size == count), or empty: any
};

class Placement {
 public:
  // gpus: the ordinals this daemon schedules (empty: a CPU daemon); cpu_slots >= 1.
  Placement(std::vector<int> gpus, int cpu_slots);

  Need NeedOf(const topiary::v1::ExperimentSpec& spec) const;
  // OK when the need can be met on this daemon at all (when nothing else runs); otherwise
  // INVALID_ARGUMENT naming the field and what the daemon has.
  absl::Status Feasible(const Need& need) const;
  // The GPU ordinals granted to `id` (empty for a CPU slot), or nullopt while what it needs
  // is busy. REQUIRES: Feasible(need).
  std::optional<std::vector<int>> TryTake(const std::string& id, const Need& need);
  // Frees what `id` holds.
  void Release(const std::string& id);

  const std::vector<int>& gpus() const { return gpus_; }
  // Per GPU (in gpus() order): the experiment holding it, or "".
  const std::vector<std::string>& occupants() const { return holder_; }
  int cpu_slots() const { return static_cast<int>(cpu_holder_.size()); }
  int running() const;

 private:
  std::vector<int> gpus_;
  std::vector<std::string> holder_;      // per GPU
  std::vector<std::string> cpu_holder_;  // per CPU slot
};

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_PLACEMENT_H_
