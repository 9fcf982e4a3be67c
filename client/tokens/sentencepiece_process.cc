#include "client/tokens/sentencepiece_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace stagecoach::client {
namespace {

constexpr char kTool[] = "stagecoach-sentencepiece";

// Reads `fds` (stdout, stderr of the child) until both close or `deadline`; false on timeout.
bool Drain(int out_fd, int err_fd, std::string* out, std::string* err, absl::Time deadline) {
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

std::string SentencePieceToolPath() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path beside = self.parent_path() / kTool;
  if (!ec && std::filesystem::exists(beside, ec)) return beside.string();
  return kTool;
}

absl::StatusOr<std::string> RunSentencePieceTool(const std::vector<std::string>& args,
                                                 absl::Duration timeout) {
  const std::string tool = SentencePieceToolPath();
  std::vector<std::string> argv_strings = {tool};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("cannot make pipes for ", kTool, ": ",
                                            std::strerror(errno)));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    if (tool.find('/') != std::string::npos) {
      ::execv(tool.c_str(), argv.data());
    } else {
      ::execvp(tool.c_str(), argv.data());
    }
    std::fprintf(stderr, "cannot run %s (beside stagectl or on PATH): %s\n", kTool,
                 std::strerror(errno));
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    return absl::InternalError(absl::StrCat("cannot start ", kTool, ": ", std::strerror(errno)));
  }
  std::string out, err;
  const bool drained = Drain(out_pipe[0], err_pipe[0], &out, &err, absl::Now() + timeout);
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  if (!drained) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!drained) {
    return absl::DeadlineExceededError(absl::StrCat(
        kTool, " ", absl::StrJoin(args, " "), " did not finish within ",
        absl::FormatDuration(timeout)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(kTool, " ", args.empty() ? "" : args[0], " failed: ",
                                            absl::StripTrailingAsciiWhitespace(err)));
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> EncodeWithTokenizer(const std::string& tokenizer,
                                                         const std::string& text) {
  absl::StatusOr<std::string> out =
      RunSentencePieceTool({"encode", "--text", text, "--tokenizer", tokenizer});
  if (!out.ok()) return out.status();
  std::vector<int32_t> ids;
  for (absl::string_view word : absl::StrSplit(*out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(word, &id)) {
      return absl::InternalError(absl::StrCat(kTool, " encode printed '", word, "', not an id"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::string> DecodeWithTokenizer(const std::string& tokenizer,
                                                const std::vector<int32_t>& ids) {
  char path[] = "/tmp/stagectl-ids-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot make a temporary file: ", std::strerror(errno)));
  }
  ::close(fd);
  {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    for (int32_t id : ids) {
      const uint32_t v = static_cast<uint32_t>(id);
      file.write(reinterpret_cast<const char*>(&v), sizeof(v));
    }
  }
  absl::StatusOr<std::string> text =
      RunSentencePieceTool({"decode", path, "--tokenizer", tokenizer, "--dtype", "uint32"});
  ::unlink(path);
  return text;
}

}  // namespace stagecoach::client
