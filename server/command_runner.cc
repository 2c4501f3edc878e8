#include "server/command_runner.h"

#include <unistd.h>

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/subprocess.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

extern char** environ;

namespace topiary::server {
namespace {

constexpr size_t kMaxArgs = 64;
constexpr size_t kMaxArgBytes = 4096;
constexpr size_t kMaxOutputBytes = size_t{16} << 20;

// The flags each command may carry in the daemon; bool flags take no value.
const std::map<std::string, std::set<std::string>>& AllowedFlags() {
  static const auto* flags = new std::map<std::string, std::set<std::string>>{
      {"evaluate",
       {"set", "multipliers", "weight_code", "weight_scales", "bench", "batch", "baseline",
        "device", "json"}},
      {"sensitivity", {"budget", "weight_code", "weight_scales", "json"}},
      {"export", {"onnx", "batch", "batch_norm", "json"}},
  };
  return *flags;
}

bool IsBoolFlag(const std::string& name) { return name == "bench" || name == "json"; }

}  // namespace

bool IsDaemonCommand(const std::string& command) { return AllowedFlags().count(command) > 0; }

absl::StatusOr<CommandArgs> CheckCommandArgs(const std::string& command,
                                             const std::vector<std::string>& args) {
  const auto it = AllowedFlags().find(command);
  if (it == AllowedFlags().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("command: '", command,
                     "' does not run in the daemon (evaluate, sensitivity, "
                     "export do)"));
  }
  if (args.size() > kMaxArgs) {
    return absl::InvalidArgumentError(
        absl::StrCat("args: ", args.size(), " of them; at most ", kMaxArgs));
  }
  CommandArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() > kMaxArgBytes || arg.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("args[", i, "]: longer than ", kMaxArgBytes, " bytes, or holds a NUL"));
    }
    if (arg.empty() || arg[0] != '-') {  // the checkpoint, then multipliers
      if (out.checkpoint.empty()) out.checkpoint = arg;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("args[", i, "]: '", arg, "' is no flag"));
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (!it->second.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("args: --", name, " is not taken by ", command,
                                                     " in the daemon (it takes --",
                                                     absl::StrJoin(it->second, ", --"), ")"));
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (!IsBoolFlag(name)) {
      if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("args: --", name, " needs a value"));
      }
      value = args[++i];
    }
    if (name == "onnx") out.onnx = value;
    if (name == "device") out.device = value;
  }
  return out;
}

std::string FindTopiaryBinary() {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  const std::string self(exe, static_cast<size_t>(n));
  const std::string dir = self.substr(0, self.rfind('/'));
  for (const std::string& c : {dir + "/topiary", dir + "/../clients/topiary"}) {
    if (::access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

absl::StatusOr<int> RunTopiary(const CommandEnvironment& env, const std::string& command,
                               const std::vector<std::string>& args, int gpu,
                               const std::function<void(bool, const std::string&)>& output,
                               const std::function<bool()>& cancelled) {
  if (env.topiary_binary.empty()) {
    return absl::FailedPreconditionError(
        "this daemon found no topiary binary to run commands with (install it beside topiaryd, "
        "or start topiaryd with --topiary_binary)");
  }
  std::vector<std::string> argv_s = {env.topiary_binary, command};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    // The daemon's own settings and the client's connection never reach the child.
    if (absl::StartsWith(v, "TOPIARY_") || absl::StartsWith(v, "CUDA_VISIBLE_DEVICES=") ||
        absl::StartsWith(v, "XDG_CACHE_HOME=")) {
      continue;
    }
    env_s.push_back(v);
  }
  env_s.push_back("TOPIARY_READ_ROOTS=" + absl::StrJoin(env.read_roots, ":"));
  env_s.push_back("TOPIARY_WRITE_ROOTS=" + env.data_dir);
  env_s.push_back(absl::StrCat("TOPIARY_MAX_FILE_BYTES=", env.max_file_bytes));
  env_s.push_back("TOPIARY_MULTIPLIERS=" + env.data_dir + "/multipliers");
  env_s.push_back("XDG_CACHE_HOME=" + env.data_dir + "/plan_cache");
  env_s.push_back(gpu >= 0 ? absl::StrCat("CUDA_VISIBLE_DEVICES=", gpu) : "CUDA_VISIBLE_DEVICES=");
  size_t total = 0;
  TOPIARY_ASSIGN_OR_RETURN(const int code,
                           RunChild(
                               {argv_s, env_s, env.data_dir},
                               [&](bool is_stderr, const std::string& bytes) {
                                 total += bytes.size();
                                 if (total <= kMaxOutputBytes) output(is_stderr, bytes);
                               },
                               [&] { return cancelled() || total > kMaxOutputBytes; }));
  if (total > kMaxOutputBytes) {
    output(true, absl::StrCat("topiaryd: the command printed more than ",
                              HumanBytes(kMaxOutputBytes), "; stopped\n"));
  }
  return code;
}

}  // namespace topiary::server
