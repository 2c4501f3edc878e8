// The topiary command line: a command, positional arguments, and --flags (with a value,
// repeated, or boolean). Shared by the local and remote commands.
#ifndef TOPIARY_CLIENTS_ARGS_H_
#define TOPIARY_CLIENTS_ARGS_H_

#include <map>
#include <string>
#include <vector>

namespace topiary {

// Exit codes scripts can rely on (also in `topiary --help`).
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;         // the run or experiment failed (or was cancelled)
constexpr int kExitUsage = 2;          // bad command line
constexpr int kExitInvalid = 3;        // invalid spec or request (the message names the field)
constexpr int kExitNotFound = 4;       // unknown experiment or file
constexpr int kExitWrongState = 5;     // the experiment's state does not allow it
constexpr int kExitUnavailable = 6;    // no daemon at --server
constexpr int kExitDenied = 7;         // unauthenticated, or a path outside the data directory
constexpr int kExitResourceLimit = 8;  // queue full, request too large

// The exit code for a failure with this status code (absl and gRPC share the numbers):
// INVALID_ARGUMENT and DATA_LOSS (a bad spec, request or input file) 3, NOT_FOUND 4,
// FAILED_PRECONDITION 5, UNAVAILABLE and DEADLINE_EXCEEDED 6, UNAUTHENTICATED and
// PERMISSION_DENIED 7, RESOURCE_EXHAUSTED 8, anything else 1; OK is 0.
int ExitCodeForStatus(int code);

struct Args {
  std::string command;
  std::vector<std::string> positional;       // after the command
  std::map<std::string, std::string> flags;  // --name value (last one wins)
  std::vector<std::string> sets;             // every --set
  bool json = false, watch = false;

  std::string flag(const std::string& name, const std::string& fallback = "") const {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
  bool has(const std::string& name) const { return flags.count(name) > 0; }
};

// False (with `error`) on an unknown flag or a flag without its value.
bool ParseArgs(int argc, char** argv, Args* args, std::string* error);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_ARGS_H_
