// Child processes for multi-process tests: daemons started and read from, commands run to
// completion. Children die with the test process (PR_SET_PDEATHSIG) and are killed and reaped
// by the destructor, so no test leaves processes behind.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::testing {

// A running child whose stdout the test reads line by line; its stderr goes to a log file.
class ChildProcess {
 public:
  // Starts argv[0] (a path) with `env` added to the environment.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv, const std::string& stderr_path,
      const std::map<std::string, std::string>& env = {});
  ~ChildProcess();

  // The next line of stdout (without '\n'); DEADLINE_EXCEEDED after `timeout`, OUT_OF_RANGE
  // at end of file.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);

  // Sends `sig` to the child.
  void Signal(int sig);
  // Waits up to `timeout` for the child to exit; its exit code (128+signal when killed).
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM, then SIGKILL if it has not exited after `grace`; reaps it.
  void Stop(absl::Duration grace = absl::Seconds(3));
  bool running();

  // For failure messages: "pid N running: 12 threads, states S:10 R:2" and each thread's name,
  // state and wait channel; "pid N exited with code C"; or "pid N killed by signal S (NAME)". A
  // worker that went silent shows here whether it died or is stuck.
  std::string Describe();

  pid_t pid() const { return pid_; }
  const std::string& stderr_path() const { return stderr_path_; }
  // The last `bytes` of the child's stderr log, for failure messages.
  std::string StderrTail(size_t bytes = 4000) const;

 private:
  ChildProcess(pid_t pid, int stdout_fd, std::string stderr_path)
      : pid_(pid), stdout_fd_(stdout_fd), stderr_path_(std::move(stderr_path)) {}

  pid_t pid_;
  int stdout_fd_;
  std::string stderr_path_;
  std::string buffered_;
  bool exited_ = false;
  int exit_code_ = -1;
  int raw_status_ = -1;  // waitpid's status once exited (-1: unknown)
};

struct CommandResult {
  int exit_code = -1;  // 128+signal when killed; -1 when it timed out
  std::string out;
  std::string err;
};

// Runs argv to completion (killed after `timeout`), capturing stdout and stderr.
CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                         const std::map<std::string, std::string>& env = {});

}  // namespace stagecoach::testing
