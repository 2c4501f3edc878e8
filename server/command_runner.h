// Remote evaluate, sensitivity and export (the RunCommand call): the daemon runs its sibling
// `topiary` binary on a checkpoint in its data directory and streams what it prints back, so
// the output is, byte for byte, what the same command prints locally. A child process also
// keeps a crash or a runaway allocation of the evaluation out of the daemon, and gives the
// memory back when it ends.
//
// The child runs in the data directory with the daemon's file policies (TOPIARY_READ_ROOTS,
// TOPIARY_WRITE_ROOTS, TOPIARY_MAX_FILE_BYTES: topiary sets them before it reads anything),
// the data directory's multiplier library (TOPIARY_MULTIPLIERS) and only the GPU it was
// leased (CUDA_VISIBLE_DEVICES).
#ifndef TOPIARY_SERVER_COMMAND_RUNNER_H_
#define TOPIARY_SERVER_COMMAND_RUNNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace topiary::server {

struct CommandEnvironment {
  std::string topiary_binary;           // the client binary to run
  std::string data_dir;                 // canonical: its working folder and write root
  std::vector<std::string> read_roots;  // the data directory and the dataset folders
  uint64_t max_file_bytes = uint64_t{2} << 30;
};

// The commands a client may run in the daemon, and the flags each may carry there (the
// connection flags and --remote are the client's, never passed on).
bool IsDaemonCommand(const std::string& command);

// What the daemon needs to know of a command's arguments.
struct CommandArgs {
  std::string checkpoint;  // the first argument that is no flag or flag value
  std::string onnx;        // export's --onnx ("" otherwise)
  std::string device;      // --device ("" otherwise)
};

// Checks `args` (what follows the command) for `command`: known flags only, sizes bounded.
absl::StatusOr<CommandArgs> CheckCommandArgs(const std::string& command,
                                             const std::vector<std::string>& args);

// The default client binary: `topiary` beside this executable, or in a Bazel output tree
// (bin/server/topiaryd -> bin/clients/topiary); "" when there is none.
std::string FindTopiaryBinary();

// Runs `topiary COMMAND ARGS...` as described above. `gpu` is the leased GPU's ordinal (-1:
// none visible). `output(is_stderr, bytes)` gets its output as it comes (at most 16 MiB in
// all; beyond that it is cut off and the child stopped). When `cancelled()` turns true the
// child is killed. Returns its exit code (128 + signal when it was killed by one).
absl::StatusOr<int> RunTopiary(const CommandEnvironment& env, const std::string& command,
                               const std::vector<std::string>& args, int gpu,
                               const std::function<void(bool, const std::string&)>& output,
                               const std::function<bool()>& cancelled);

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_COMMAND_RUNNER_H_
