// Running a child process from the daemon: topiary for remote commands (command_runner), and
// Slurm's commands (slurm). One place for what every child needs: stdin from /dev/null, its
// own process group (a kill reaches its helpers too), and no signals blocked (the daemon
// blocks SIGINT/SIGTERM in every thread, and a child would inherit that).
#ifndef TOPIARY_SERVER_SUBPROCESS_H_
#define TOPIARY_SERVER_SUBPROCESS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace topiary::server {

struct ChildProcess {
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up on PATH
  // The child's environment; empty: the daemon's.
  std::vector<std::string> env;
  std::string cwd;  // "": the daemon's
};

// Runs `child`, handing its output to output(is_stderr, bytes) as it comes; when stop() turns
// true (polled about five times a second) the child's group is killed. The exit code, or 128 +
// the signal that ended it. Errors: the child could not be started (naming argv[0]).
absl::StatusOr<int> RunChild(const ChildProcess& child,
                             const std::function<void(bool, const std::string&)>& output,
                             const std::function<bool()>& stop);

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_SUBPROCESS_H_
