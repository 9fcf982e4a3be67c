#include "common/util/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace stagecoach {
namespace {

// Reads the child's stdout and stderr until both close or `deadline`; false on timeout.
bool DrainChildPipes(int out_fd, int err_fd, std::string* out, std::string* err,
                     absl::Time deadline) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  int open = 2;
  char buffer[65536];
  while (open > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return false;
    const int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (ready < 0 && errno != EINTR) return false;
    for (int i = 0; i < 2 && ready > 0; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open;
      }
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<ChildOutput> RunChildProcess(const std::string& program,
                                            const std::vector<std::string>& args,
                                            absl::Duration timeout) {
  std::vector<std::string> argv_strings = {program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    for (int fd : {out_pipe[0], out_pipe[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return absl::InternalError(
        absl::StrCat("cannot make pipes for ", program, ": ", std::strerror(error)));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    if (program.find('/') != std::string::npos) {
      ::execv(program.c_str(), argv.data());
    } else {
      ::execvp(program.c_str(), argv.data());
    }
    std::fprintf(stderr, "cannot run %s: %s\n", program.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    const int error = errno;
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    return absl::InternalError(absl::StrCat("cannot start ", program, ": ", std::strerror(error)));
  }
  ChildOutput result;
  const bool drained =
      DrainChildPipes(out_pipe[0], err_pipe[0], &result.out, &result.err, absl::Now() + timeout);
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  if (!drained) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!drained) {
    return absl::DeadlineExceededError(absl::StrCat(
        program, " did not finish within ", absl::FormatDuration(timeout), " and was killed"));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string HelperProgramPath(const std::string& name, const char* env) {
  if (const char* set = std::getenv(env); set != nullptr && *set != '\0') return set;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / name;
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return name;
}

}  // namespace stagecoach
