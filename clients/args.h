// The topiary command line: a command, positional arguments and Abseil flags (with a value,
// boolean, or --set, which repeats). Shared by the local and remote commands.
#ifndef TOPIARY_CLIENTS_ARGS_H_
#define TOPIARY_CLIENTS_ARGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

struct Args;
// Reports a local command's failure (as {"error": ...} with --json, else on stderr) and
// returns its exit code (ExitCodeForStatus).
int Fail(const Args& a, const absl::Status& st);

// The parsed command line. Flags are Abseil flags (defined in args.cc, listed by
// `topiary --help`); an empty string or nullopt means the flag was not given.
struct Args {
  std::string command;
  std::vector<std::string> positional;  // after the command
  std::vector<std::string> sets;        // every --set field=value, in order
  std::string out, resume, file, layer, server, token_file, tls_ca, state, name, png, onnx;
  std::string batch;                     // evaluate --bench: N; export: N or "dynamic"
  std::string baseline;                  // evaluate --bench: a second checkpoint to compare with
  std::vector<std::string> multipliers;  // evaluate: one row per multiplier
  std::string device;                    // evaluate: cpu | cuda (empty: the checkpoint's)
  std::string axis;                      // compare --png: sparsity | macs
  std::string data;                      // evaluate, sensitivity, import: a data set
  std::optional<int64_t> test_limit;     // evaluate, sensitivity
  std::string batch_norm;                // export: fold | keep
  std::string weight_code;               // asymmetric | sign_magnitude (empty: the checkpoint's)
  std::string weight_scales;             // per_tensor | per_channel (empty: the checkpoint's)
  std::optional<uint32_t> from;
  std::optional<double> target, step, budget;
  std::optional<int> epochs;
  bool json = false, watch = false, bench = false, finish = false, remote = false;
  bool sha256 = false;             // files: with checksums
  bool help = false;               // COMMAND --help: that command's usage
  std::vector<std::string> given;  // the flags given (names without "--"), in order
  std::vector<std::string> raw;    // every argument after the command, as given
  // import
  std::string input, arch;
  std::vector<std::string> mean, std;
  std::optional<double> max_value;
  // worker
  std::optional<int> rank, world, local_rank;
  std::string rendezvous, experiment;
};

// False (with `error`) on an unknown flag, a flag without its value or a value of the
// wrong type. Call once per process: the flags are global.
bool ParseArgs(int argc, char** argv, Args* args, std::string* error);

// import's --input: "224x224x3" (or "28x28", one channel) into h, w, c; false when it is not
// that (each size in [1, 4096]).
bool ParseImageSize(const std::string& text, int* h, int* w, int* c);
// import's --mean / --std values as floats; the error names `flag` and the value.
absl::StatusOr<std::vector<float>> ParseFloats(const std::vector<std::string>& texts,
                                               const char* flag);

// An error naming the first flag in a.given that a.command does not take, and the flags it
// takes (a flag meant for another command, or a typo of one, is refused rather than
// ignored); OK for a command this table does not know (main reports those).
absl::Status CheckCommandFlags(const Args& a);

// The entries of `usage` (the --help text) about `command`: each line "  topiary COMMAND ..."
// (or "... | COMMAND ...") and its indented continuation lines, then the flags it takes with
// their help; empty for an unknown command.
std::string CommandUsage(const std::string& usage, const std::string& command);

// One line per flag ("--name  help"), from the flag registry, for `topiary --help`.
std::string FlagsHelp();

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_ARGS_H_
