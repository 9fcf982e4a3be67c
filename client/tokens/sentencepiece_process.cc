#include "client/tokens/sentencepiece_process.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/util/child_process.h"

namespace stagecoach::client {
namespace {

constexpr char kTool[] = "stagecoach-sentencepiece";

}  // namespace

std::string SentencePieceToolPath() {
  return HelperProgramPath(kTool, "STAGECOACH_SENTENCEPIECE_TOOL");
}

absl::StatusOr<std::string> RunSentencePieceTool(const std::vector<std::string>& args,
                                                 absl::Duration timeout) {
  absl::StatusOr<ChildOutput> run = RunChildProcess(SentencePieceToolPath(), args, timeout);
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    return absl::InternalError(absl::StrCat(kTool, " ", args.empty() ? "" : args[0], " failed: ",
                                            absl::StripTrailingAsciiWhitespace(run->err)));
  }
  return std::move(run->out);
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
