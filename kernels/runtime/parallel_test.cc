// Threads the system will not start: a run that asks for them fails with a status, never
// by libgomp aborting the process (topiaryd and every experiment in it).
#include "kernels/runtime/parallel.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

TEST(Parallel, ThreadsThatStartAreChecked) {
  EXPECT_TRUE(CheckThreadsStart(1).ok());
  EXPECT_TRUE(CheckThreadsStart(16).ok());
  EXPECT_GE(MachineThreadLimit(), 8);
  EXPECT_GE(MachineThreadLimit(), 4 * static_cast<int>(std::thread::hardware_concurrency()));
}

// In a child whose address space leaves room for a few thread stacks only, as a loaded or
// capped machine would: the check says how many started, and the process lives on.
TEST(Parallel, ThreadsTheSystemRefusesAreAnErrorNotAnAbort) {
  long kib = 0;
  const int rc = testing::RunInChild(
      [] {
        struct rlimit as;
        ::getrlimit(RLIMIT_AS, &as);
        // Each thread's stack is 8 MiB of address space (ulimit -s): 64 MiB more fits a few.
        FILE* f = std::fopen("/proc/self/statm", "r");
        long pages = 0;
        if (f == nullptr || std::fscanf(f, "%ld", &pages) != 1) return 10;
        std::fclose(f);
        as.rlim_cur = static_cast<rlim_t>(pages) * ::sysconf(_SC_PAGESIZE) + (64 << 20);
        if (::setrlimit(RLIMIT_AS, &as) != 0) return 11;
        const absl::Status st = CheckThreadsStart(4096);
        if (st.ok()) return 12;
        if (st.code() != absl::StatusCode::kResourceExhausted) return 13;
        if (std::string(st.message()).find("of the 4096 CPU threads") == std::string::npos) {
          return 14;
        }
        return CheckThreadsStart(1).ok() ? 0 : 15;  // and what started has ended
      },
      &kib);
  EXPECT_EQ(rc, 0) << "-1: the child died of a signal (an abort)";
}

}  // namespace
}  // namespace topiary::kernels
