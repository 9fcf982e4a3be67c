// Running a helper program as a child process and collecting what it prints: for tools that
// cannot share a process with ours (stagecoach-sentencepiece, whose libsentencepiece carries its
// own protobuf: common/text/sentencepiece_tokenizer.h). No shell: arguments go to execv as they
// are. The child's stdin is /dev/null; its stdout and stderr are read whole until it exits.
//
// Every run has a deadline: a child still running then is killed (SIGKILL) and reaped.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stagecoach {

struct ChildOutput {
  int exit_code = 0;  // the child's exit status (128 + N when killed by signal N)
  std::string out;    // its stdout
  std::string err;    // its stderr
};

// Runs `program` (a path, or a bare name looked up on PATH) with `args` and waits for it.
// DEADLINE_EXCEEDED naming the program after `timeout` (the child killed); INTERNAL when no
// pipe or process can be made. A program that cannot be executed exits 127 with the reason on
// its stderr.
absl::StatusOr<ChildOutput> RunChildProcess(const std::string& program,
                                            const std::vector<std::string>& args,
                                            absl::Duration timeout);

// Where to find the helper program `name` (for example "stagecoach-sentencepiece"): the
// environment variable `env` when it is set and not empty, else `name` beside this process's
// executable (/proc/self/exe) when it is there, else the bare name (looked up on PATH).
std::string HelperProgramPath(const std::string& name, const char* env);

}  // namespace stagecoach
