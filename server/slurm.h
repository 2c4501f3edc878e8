// topiaryd --scheduler slurm: experiments run as Slurm jobs. Slurm allocates, launches,
// signals and cancels; the job's tasks are `topiary worker` processes (one rank each, srun),
// and rank 0 reports the run's events to the daemon over gRPC (ReportRunEvents, with the
// daemon's token). This file speaks to Slurm through its own commands (sbatch, squeue,
// scontrol, scancel), which every Slurm site has, whatever its REST setup.
#ifndef TOPIARY_SERVER_SLURM_H_
#define TOPIARY_SERVER_SLURM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"

namespace topiary::server {

struct SlurmOptions {
  std::string topiary_binary;  // the worker binary, at a path every node reads
  std::string report_address;  // host:port where the workers reach this daemon
  std::string token_file;      // the daemon's token, for the workers (shared storage); "" none
  std::string tls_ca;          // a CA the workers trust for the daemon's TLS; "" plain
  std::vector<std::string> sbatch_args;  // added to every sbatch (--partition=..., --account=...)
};

// What sbatch gets for an experiment: its ranks as tasks (one GPU each for CUDA runs, the
// spec's threads as CPUs per task), its output in FOLDER/slurm/job-JOBID.out, and a script
// running `srun --kill-on-bad-exit=1 topiary worker ...` (a task that dies ends the job).
struct SlurmJob {
  std::string experiment_id;
  std::string folder;       // the experiment's folder (absolute; shared storage)
  std::string resume_from;  // absolute checkpoint path, or ""
  topiary::v1::ExperimentSpec spec;
};

class Slurm {
 public:
  explicit Slurm(SlurmOptions options) : options_(std::move(options)) {}
  // Once the daemon listens (before the first job).
  void set_report_address(const std::string& address) { options_.report_address = address; }

  // Writes FOLDER/slurm/{spec.textproto,job.sh} and submits; the job id.
  absl::StatusOr<std::string> Submit(const SlurmJob& job) const;
  // The job's state as Slurm names it (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...),
  // "" once Slurm no longer knows the job.
  absl::StatusOr<std::string> State(const std::string& job_id) const;
  // scancel --signal=SIGNAL (USR1: pause checkpoint; TERM: cancel) to the job's tasks.
  absl::Status Signal(const std::string& job_id, const std::string& signal) const;
  // scancel: the job ends (its tasks get TERM, then KILL).
  absl::Status Cancel(const std::string& job_id) const;

  // sbatch's arguments for `job` (without the script): for tests and the docs.
  std::vector<std::string> SbatchArgs(const SlurmJob& job) const;
  // The batch script.
  std::string Script(const SlurmJob& job) const;

 private:
  SlurmOptions options_;
};

// Whether a job in Slurm's `state` (State's answer) has yet to end.
bool SlurmJobActive(const std::string& state);

// Runs `argv` (argv[0] found on PATH) and returns what it printed (stdout and stderr, at most
// 1 MiB); errors name the command and its output when it fails or runs past timeout_s.
absl::StatusOr<std::string> RunTool(const std::vector<std::string>& argv, double timeout_s = 60);

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_SLURM_H_
