#include "server/slurm.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/subprocess.h"
#include "trainer/spec/spec.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary::server {
namespace {

// 'text' for the shell, whatever it holds.
std::string Quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

int Ranks(const topiary::v1::ExperimentSpec& spec, bool* gpu) {
  const auto& d = spec.device();
  *gpu = d.kind() != topiary::v1::DeviceSpec::CPU;
  return *gpu ? RequestedGpus(d) : CpuRanks(d);
}

}  // namespace

absl::StatusOr<std::string> RunTool(const std::vector<std::string>& argv, double timeout_s) {
  const std::string what = absl::StrJoin(argv, " ");
  std::string out;
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  bool timed_out = false;
  auto code = RunChild(
      {argv, {}, ""},
      [&](bool, const std::string& bytes) {
        if (out.size() < (1u << 20)) out += bytes;
      },
      [&] { return timed_out = timed_out || absl::Now() > deadline; });
  if (!code.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot run ", argv[0], " (", code.status().message(), "): is Slurm installed?"));
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(what, " ran past ", timeout_s, " s"));
  }
  if (*code != 0) {
    return absl::UnavailableError(absl::StrCat(what, " failed: ", absl::StripAsciiWhitespace(out)));
  }
  return out;
}

std::vector<std::string> Slurm::SbatchArgs(const SlurmJob& job) const {
  bool gpu = false;
  const int ranks = Ranks(job.spec, &gpu);
  std::vector<std::string> args = {
      "--parsable",
      "--job-name=topiary-" + job.experiment_id,
      absl::StrCat("--ntasks=", ranks),
      "--output=" + job.folder + "/slurm/job-%j.out",
      "--open-mode=append",
  };
  if (gpu) {
    args.push_back("--gpus-per-task=1");
  } else {
    args.push_back(absl::StrCat("--cpus-per-task=", std::max(1, job.spec.device().threads())));
  }
  args.insert(args.end(), options_.sbatch_args.begin(), options_.sbatch_args.end());
  return args;
}

std::string Slurm::Script(const SlurmJob& job) const {
  std::vector<std::string> worker = {options_.topiary_binary,
                                     "worker",
                                     job.folder + "/slurm/spec.textproto",
                                     "--out",
                                     job.folder,
                                     "--json",
                                     "--server",
                                     options_.report_address,
                                     "--experiment",
                                     job.experiment_id};
  if (!options_.token_file.empty()) {
    worker.push_back("--token_file");
    worker.push_back(options_.token_file);
  }
  if (!options_.tls_ca.empty()) {
    worker.push_back("--tls_ca");
    worker.push_back(options_.tls_ca);
  }
  if (!job.resume_from.empty()) {
    worker.push_back("--resume");
    worker.push_back(job.resume_from);
  }
  std::vector<std::string> quoted;
  for (const std::string& w : worker) quoted.push_back(Quote(w));
  return absl::StrCat(
      "#!/bin/bash\n# Experiment ", job.experiment_id,
      ", submitted by topiaryd: one `topiary worker` per task; a task that dies ends the job.\n",
      "exec srun --kill-on-bad-exit=1 ", absl::StrJoin(quoted, " "), "\n");
}

absl::StatusOr<std::string> Slurm::Submit(const SlurmJob& job) const {
  const std::string dir = job.folder + "/slurm";
  TOPIARY_RETURN_IF_ERROR(MakeDirs(dir));
  TOPIARY_RETURN_IF_ERROR(WriteFileAtomic(dir + "/spec.textproto", SpecToText(job.spec)));
  TOPIARY_RETURN_IF_ERROR(WriteFileAtomic(dir + "/job.sh", Script(job)));
  std::vector<std::string> argv = {"sbatch"};
  const std::vector<std::string> args = SbatchArgs(job);
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(dir + "/job.sh");
  TOPIARY_ASSIGN_OR_RETURN(std::string out, RunTool(argv));
  // --parsable: "JOBID" or "JOBID;CLUSTER".
  std::string id(absl::StripAsciiWhitespace(out.substr(0, out.find(';'))));
  if (id.empty() || id.find_first_not_of("0123456789_") != std::string::npos) {
    return absl::InternalError("sbatch answered '" + out + "', not a job id");
  }
  return id;
}

absl::StatusOr<std::string> Slurm::State(const std::string& job_id) const {
  auto out = RunTool({"squeue", "--noheader", "--jobs=" + job_id, "--format=%T"});
  // A job Slurm has forgotten is "Invalid job id" to squeue.
  if (!out.ok() && out.status().message().find("Invalid job id") == std::string::npos) {
    return out.status();
  }
  std::string state(out.ok() ? absl::StripAsciiWhitespace(*out) : "");
  if (!state.empty()) return state;
  // Gone from the queue: scontrol still knows it for a while (MinJobAge).
  auto shown = RunTool({"scontrol", "show", "job", "--oneliner", job_id});
  if (!shown.ok()) return std::string();
  const size_t at = shown->find("JobState=");
  if (at == std::string::npos) return std::string();
  const size_t from = at + 9;
  return shown->substr(from, shown->find(' ', from) - from);
}

bool SlurmJobActive(const std::string& state) {
  return state == "PENDING" || state == "CONFIGURING" || state == "RUNNING" ||
         state == "COMPLETING" || state == "SUSPENDED";
}

absl::Status Slurm::Signal(const std::string& job_id, const std::string& signal) const {
  return RunTool({"scancel", "--signal=" + signal, job_id}).status();
}

absl::Status Slurm::Cancel(const std::string& job_id) const {
  return RunTool({"scancel", job_id}).status();
}

}  // namespace topiary::server
