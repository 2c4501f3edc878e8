#include "server/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace topiary::server {

absl::StatusOr<int> RunChild(const ChildProcess& child,
                             const std::function<void(bool, const std::string&)>& output,
                             const std::function<bool()>& stop) {
  // Everything the child needs is made before it is started.
  std::vector<std::string> argv_s = child.argv, env_s = child.env;
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  auto failed = [&](int err) {
    return absl::UnavailableError(
        absl::StrCat("starting ", child.argv[0], ": ", std::strerror(err)));
  };

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return failed(errno);
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return failed(errno);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  if (!child.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, child.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  pid_t pid = 0;
  char** env = child.env.empty() ? environ : envp.data();
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), env);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return failed(rc);
  }
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  bool killed = false;
  std::string buf(64 * 1024, '\0');
  int open_fds = 2;
  while (open_fds > 0) {
    if (!killed && stop()) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
    if (::poll(fds, 2, 200) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::read(fds[i].fd, buf.data(), buf.size());
      if (n > 0) {
        output(i == 1, buf.substr(0, n));
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
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace topiary::server
