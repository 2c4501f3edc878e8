// Collective: the ranks of a data-parallel run averaging their gradients. Backends: NCCL
// between GPUs (loaded at run time from libnccl.so.2; the GPUs of one process, or one GPU
// per process of a world), host memory between CPU ranks (threads of one process), which
// emulates a multi-GPU run's arithmetic on machines without GPUs, and Gloo between CPU ranks
// of separate processes.
//
// Every rank calls the same operations with the same sizes in the same order, each from its
// own thread (trainer/dist/rank_threads.h). On a GPU the work is enqueued on a side stream
// of the rank's device, so it overlaps the backward pass: Fork makes the side stream wait
// for what the rank's stream has enqueued so far, Join makes the rank's stream wait for the
// side stream. Both work inside a CUDA graph capture.
#ifndef TOPIARY_TRAINER_DIST_COLLECTIVE_H_
#define TOPIARY_TRAINER_DIST_COLLECTIVE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/core/device.h"
#include "trainer/dist/world.h"

namespace topiary {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int ranks() const = 0;
  // "nccl 2.28.9 (ordered)", "host".
  virtual std::string name() const = 0;
  // Room for operations of up to n floats (the ordered NCCL mode gathers every rank's
  // values before summing them). Call once per rank before the first operation.
  virtual absl::Status Reserve(int rank, size_t n) { return absl::OkStatus(); }

  // GPU: the side stream's context (the rank's device; no library handles). CPU: null.
  virtual const kernels::CudaContext* side(int rank) const { return nullptr; }
  virtual absl::Status Fork(int rank) { return absl::OkStatus(); }
  virtual absl::Status Join(int rank) { return absl::OkStatus(); }

  // data[0, n) on every rank becomes the mean over the ranks of data[0, n), the same bits on
  // every rank. GPU: enqueued on the side stream. Host: returns when every rank has called
  // it (ABORTED after Abort).
  virtual absl::Status AllReduceMean(int rank, float* data, size_t n) = 0;

  // Every rank's data[0, n) into all[r * n, (r + 1) * n), on every rank: bits whole, for
  // sums a rank adds itself in rank order (synchronized batch norm's). Host: returns when
  // every rank has copied them. GPU: device memory, enqueued on the rank's own stream (not
  // the side stream: the step waits for these values), in issue order with the rank's other
  // operations (one communicator).
  virtual absl::Status AllGather(int rank, const float* data, size_t n, float* all) = 0;

  // Rank 0's data[0, n) into every rank's data[0, n) (replication). GPU: device memory, on
  // the rank's own stream; blocks until done.
  virtual absl::Status Broadcast(int rank, float* data, size_t n) = 0;

  // Every rank's bytes[0, n) of host memory into all[r * n, (r + 1) * n), on every rank;
  // blocks until done. For the few values the ranks must agree on between steps: metrics,
  // a stop request, evaluation results, the models' checksums.
  virtual absl::Status ExchangeHost(int rank, const void* data, size_t n, void* all) = 0;

  // A rank failed: operations still waiting, and all later ones, end with ABORTED instead of
  // waiting forever for it.
  virtual void Abort() = 0;
};

// CPU ranks: sums in rank order (deterministic).
std::unique_ptr<Collective> MakeHostCollective(int ranks);

// One NCCL communicator per device (one process, ncclCommInitAll). ordered = true
// (device.deterministic) gathers every rank's values and sums them in rank order, the same
// bits on every run; otherwise NCCL's all-reduce (its ring or tree order). Errors:
// FAILED_PRECONDITION when libnccl.so.2 cannot be loaded (naming why) or in a build without
// CUDA.
absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(const std::vector<Device*>& devices,
                                                               bool ordered);

// One rank of a run of several processes (world.multi()), one per process. GPU: NCCL with its
// own bootstrap (global rank 0 writes the unique id into world.rendezvous, the others read it
// there). Errors: FAILED_PRECONDITION without NCCL or CUDA; DEADLINE_EXCEEDED when rank 0's id
// does not come within timeout_s.
absl::StatusOr<std::unique_ptr<Collective>> MakeNcclWorldCollective(Device* device,
                                                                    const World& world,
                                                                    bool ordered, double timeout_s);
// CPU: Gloo over TCP, its file store in world.rendezvous; always sums in rank order (the same
// bits as CPU ranks in one process). Errors: FAILED_PRECONDITION in a build without Gloo
// (the static one); DEADLINE_EXCEEDED when the others do not connect within timeout_s.
absl::StatusOr<std::unique_ptr<Collective>> MakeGlooCollective(const World& world,
                                                               double timeout_s);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_COLLECTIVE_H_
