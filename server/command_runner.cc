#include "server/command_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainer/util/file_util.h"

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
  // Everything the child needs is made before it is started.
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
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return ErrnoStatus(errno, "a pipe for the command");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return ErrnoStatus(errno, "a pipe for the command");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawn_file_actions_addchdir_np(&actions, env.data_dir.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: a kill reaches its helpers too
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);  // the daemon blocks SIGINT/SIGTERM; the child not
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return ErrnoStatus(rc, "starting " + env.topiary_binary);
  }
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  size_t total = 0;
  bool killed = false;
  std::string buf(64 * 1024, '\0');
  int open_fds = 2;
  while (open_fds > 0) {
    if (!killed && (cancelled() || total > kMaxOutputBytes)) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
    if (::poll(fds, 2, 200) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::read(fds[i].fd, buf.data(), buf.size());
      if (n > 0) {
        total += n;
        if (total <= kMaxOutputBytes) output(i == 1, buf.substr(0, n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      ::close(fds[i].fd);
      fds[i].fd = -1;
      --open_fds;
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (total > kMaxOutputBytes) {
    output(true, absl::StrCat("topiaryd: the command printed more than ",
                              HumanBytes(kMaxOutputBytes), "; stopped\n"));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace topiary::server
