// `topiary worker`: one rank of an experiment run by several processes (Slurm's srun starts
// one per task; by hand, one per rank with --rank/--world). Where the process stands comes
// from its flags or from Slurm's environment; pause and cancel come as signals.
#ifndef TOPIARY_CLIENTS_WORKER_H_
#define TOPIARY_CLIENTS_WORKER_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/args.h"
#include "clients/connection.h"
#include "trainer/dist/world.h"
#include "trainer/run/runner.h"

namespace topiary {

struct WorkerFlags {
  std::optional<int> rank, world, local_rank;
  std::string rendezvous, out;
};

// The world from the flags, else from Slurm's SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID
// (read through `env`). The rendezvous: --rendezvous, else under Slurm
// OUT/rendezvous/job<SLURM_JOB_ID>.<SLURM_STEP_ID> (fresh for each launch). INVALID_ARGUMENT
// names the flag or variable that is missing or out of range.
absl::StatusOr<World> ResolveWorld(const WorkerFlags& flags,
                                   const std::function<const char*(const char*)>& env);

// Pause and cancel by signal, as Slurm delivers them: SIGUSR1 (scancel --signal=USR1) asks for
// a pause checkpoint, SIGTERM and SIGINT (scancel, Ctrl-C) for cancelling. The processes of
// the world agree on the request between steps (RunOptions::world), so all stop alike.
// Rank 0's events to the daemon that submitted the job (ReportRunEvents), in order: each
// event is sent as it comes with those not yet acknowledged (a daemon that is briefly away
// gets them later); the summary is retried for up to a minute, since the daemon learns how
// the run ended from it.
class EventReporter {
 public:
  EventReporter(const Args& a, std::string slurm_job_id);
  void Send(const topiary::v1::Event& e);

 private:
  bool Flush();
  Connection connection_;
  std::string experiment_, job_;
  std::vector<topiary::v1::Event> pending_;
};

class SignalControl : public RunControl {
 public:
  // Installs the handlers (one SignalControl per process).
  SignalControl();
  Stop ShouldStop() override;
  Stop WaitForRound(int, topiary::v1::PruningSpec*) override { return ShouldStop(); }
};

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_WORKER_H_
