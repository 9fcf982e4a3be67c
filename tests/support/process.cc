#include "tests/support/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace stagecoach::testing {
namespace {

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Forks and execs argv with stdout/stderr wired to the given fds (-1: leave as is). In the
// child only async-signal-safe calls are made before exec.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& env, int stdout_fd,
                            int stderr_fd, int close_fd1, int close_fd2) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (env.count(key) == 0) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    // Unblock everything the test process may have blocked; daemons install their own.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (stdout_fd >= 0) dup2(stdout_fd, STDOUT_FILENO);
    if (stderr_fd >= 0) dup2(stderr_fd, STDERR_FILENO);
    if (close_fd1 >= 0) close(close_fd1);
    if (close_fd2 >= 0) close(close_fd2);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& stderr_path,
    const std::map<std::string, std::string>& env) {
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("not an executable: ", argv[0]));
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  const int err_fd = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError(absl::StrCat("cannot open ", stderr_path));
  }
  auto pid = Spawn(argv, env, out[1], err_fd, out[0], -1);
  close(out[1]);
  close(err_fd);
  if (!pid.ok()) {
    close(out[0]);
    return pid.status();
  }
  return std::unique_ptr<ChildProcess>(new ChildProcess(*pid, out[0], stderr_path));
}

ChildProcess::~ChildProcess() {
  Stop(absl::Seconds(3));
  close(stdout_fd_);
}

absl::StatusOr<std::string> ChildProcess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line from pid ", pid_, " within ", absl::FormatDuration(timeout)));
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
    if (n <= 0) return absl::OutOfRangeError(absl::StrCat("pid ", pid_, " closed its stdout"));
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

void ChildProcess::Signal(int sig) {
  if (!exited_) kill(pid_, sig);
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!exited_) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      exit_code_ = DecodeStatus(status);
      raw_status_ = status;
      break;
    }
    if (r < 0) {
      exited_ = true;
      break;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return exit_code_;
}

bool ChildProcess::running() {
  if (exited_) return false;
  return !Wait(absl::ZeroDuration()).ok();
}

void ChildProcess::Stop(absl::Duration grace) {
  if (exited_) return;
  Signal(SIGTERM);
  if (!Wait(grace).ok()) {
    Signal(SIGKILL);
    (void)Wait(absl::Seconds(10));
  }
}

namespace {

// The first line of a /proc file, or "?".
std::string ReadProcLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return "?";
  return line;
}

struct ThreadState {
  std::string name = "?";
  std::string state = "?";  // R running, S sleeping, D disk wait, T stopped, ...
  std::string wchan = "-";  // the kernel function it sleeps in
};

// One thread of a process, from /proc/<pid>/task/<tid>.
ThreadState ReadThread(const std::filesystem::path& task) {
  ThreadState out;
  // stat: "tid (comm) state ...": comm may hold spaces and parentheses, so split at the last ')'.
  const std::string stat = ReadProcLine((task / "stat").string());
  const size_t open = stat.find('(');
  const size_t close = stat.rfind(')');
  if (open != std::string::npos && close != std::string::npos && close > open) {
    out.name = stat.substr(open + 1, close - open - 1);
    if (close + 2 < stat.size()) out.state = stat.substr(close + 2, 1);
  }
  const std::string wchan = ReadProcLine((task / "wchan").string());
  if (!wchan.empty() && wchan != "0" && wchan != "?") out.wchan = wchan;
  return out;
}

}  // namespace

std::string ChildProcess::Describe() {
  if (running()) {
    std::vector<ThreadState> threads;
    std::map<std::string, int> by_state;
    std::error_code ec;
    const std::filesystem::path tasks = absl::StrCat("/proc/", pid_, "/task");
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      threads.push_back(ReadThread(task.path()));
      ++by_state[threads.back().state];
    }
    std::string out = absl::StrCat("pid ", pid_, " running: ", threads.size(), " threads, states");
    for (const auto& [state, n] : by_state) absl::StrAppend(&out, " ", state, ":", n);
    absl::StrAppend(&out, "\n  threads (name state wchan):");
    for (const ThreadState& t : threads) {
      absl::StrAppend(&out, " [", t.name, " ", t.state, " ", t.wchan, "]");
    }
    return out;
  }
  if (raw_status_ != -1 && WIFSIGNALED(raw_status_)) {
    const int sig = WTERMSIG(raw_status_);
    return absl::StrCat("pid ", pid_, " killed by signal ", sig, " (", strsignal(sig), ")",
                        WCOREDUMP(raw_status_) ? ", core dumped" : "");
  }
  return absl::StrCat("pid ", pid_, " exited with code ", exit_code_);
}

std::string ChildProcess::StderrTail(size_t bytes) const {
  std::ifstream in(stderr_path_);
  std::stringstream s;
  s << in.rdbuf();
  std::string all = s.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                         const std::map<std::string, std::string>& env) {
  CommandResult result;
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return result;
  auto pid = Spawn(argv, env, out[1], err[1], out[0], err[0]);
  close(out[1]);
  close(err[1]);
  if (!pid.ok()) {
    close(out[0]);
    close(err[0]);
    result.err = std::string(pid.status().message());
    return result;
  }
  const absl::Time deadline = absl::Now() + timeout;
  bool out_open = true, err_open = true, timed_out = false;
  while (out_open || err_open) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      timed_out = true;
      kill(*pid, SIGKILL);
      break;
    }
    pollfd fds[2] = {{out_open ? out[0] : -1, POLLIN, 0}, {err_open ? err[0] : -1, POLLIN, 0}};
    if (poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        (i == 0 ? out_open : err_open) = false;
      } else {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  close(out[0]);
  close(err[0]);
  int status = 0;
  waitpid(*pid, &status, 0);
  result.exit_code = timed_out ? -1 : DecodeStatus(status);
  return result;
}

}  // namespace stagecoach::testing
