// server/slurm: what sbatch gets for an experiment (tasks, GPUs or CPUs per task, the
// operator's arguments), the batch script's quoting of hostile paths (checked by bash itself),
// and how the Slurm commands' failures come back. The daemon against a real Slurm cluster:
// clients/python/tests/test_slurm.py.
#include "server/slurm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_split.h"

namespace topiary::server {
namespace {

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

SlurmJob Job(const std::string& folder) {
  SlurmJob job;
  job.experiment_id = "exp-0007";
  job.folder = folder;
  return job;
}

TEST(Slurm, SbatchGetsTheRanksAsTasks) {
  SlurmOptions o;
  o.sbatch_args = {"--partition=gpu", "--account=lab"};
  Slurm slurm(o);
  SlurmJob cpu = Job("/shared/exp-0007");
  cpu.spec.mutable_device()->set_kind(topiary::v1::DeviceSpec::CPU);
  cpu.spec.mutable_device()->set_cpu_ranks(2);
  cpu.spec.mutable_device()->set_threads(3);
  auto args = slurm.SbatchArgs(cpu);
  EXPECT_TRUE(Has(args, "--ntasks=2"));
  EXPECT_TRUE(Has(args, "--cpus-per-task=3"));
  EXPECT_FALSE(Has(args, "--gpus-per-task=1"));
  EXPECT_TRUE(Has(args, "--job-name=topiary-exp-0007"));
  EXPECT_TRUE(Has(args, "--output=/shared/exp-0007/slurm/job-%j.out"));
  EXPECT_EQ(args.back(), "--account=lab");
  SlurmJob gpu = Job("/shared/exp-0007");
  gpu.spec.mutable_device()->set_kind(topiary::v1::DeviceSpec::CUDA);
  gpu.spec.mutable_device()->set_gpu_count(4);
  args = slurm.SbatchArgs(gpu);
  EXPECT_TRUE(Has(args, "--ntasks=4"));
  EXPECT_TRUE(Has(args, "--gpus-per-task=1"));
}

// Paths with quotes, spaces and shell syntax reach the worker as single arguments.
TEST(Slurm, TheScriptQuotesEveryArgument) {
  SlurmOptions o;
  o.topiary_binary = "/opt/top iary/bin/topiary";
  o.report_address = "login1:7077";
  o.token_file = "/shared/tok'en; rm -rf /";
  Slurm slurm(o);
  SlurmJob job = Job("/shared/a b'c$(touch x)");
  job.resume_from = "/shared/a b'c$(touch x)/checkpoints/pause.h5";
  const std::string script = slurm.Script(job);
  const std::string marker = "exec srun --kill-on-bad-exit=1 ";
  const size_t at = script.find(marker);
  ASSERT_NE(at, std::string::npos) << script;
  std::string line = script.substr(at + marker.size());
  line = line.substr(0, line.find('\n'));
  // bash splits the line as srun would receive it.
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string probe = std::string(tmp ? tmp : "/tmp") + "/slurm_test_probe.sh";
  FILE* f = std::fopen(probe.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "printf '%%s\\n' %s\n", line.c_str());
  std::fclose(f);
  auto out = RunTool({"bash", probe});
  std::remove(probe.c_str());
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<std::string> argv = absl::StrSplit(*out, '\n', absl::SkipEmpty());
  const std::vector<std::string> want = {"/opt/top iary/bin/topiary",
                                         "worker",
                                         "/shared/a b'c$(touch x)/slurm/spec.textproto",
                                         "--out",
                                         "/shared/a b'c$(touch x)",
                                         "--json",
                                         "--server",
                                         "login1:7077",
                                         "--experiment",
                                         "exp-0007",
                                         "--token_file",
                                         "/shared/tok'en; rm -rf /",
                                         "--resume",
                                         "/shared/a b'c$(touch x)/checkpoints/pause.h5"};
  EXPECT_EQ(argv, want);
}

TEST(Slurm, ToolFailuresSayWhat) {
  auto missing = RunTool({"no-such-slurm-tool-here", "--version"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("no-such-slurm-tool-here"), std::string::npos);
  auto failed = RunTool({"bash", "-c", "echo Invalid job id specified; exit 1"});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("Invalid job id"), std::string::npos);
  auto slow = RunTool({"sleep", "5"}, 0.2);
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded);
  auto ok = RunTool({"bash", "-c", "echo 1234"});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "1234\n");
}

}  // namespace
}  // namespace topiary::server
