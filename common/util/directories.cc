#include "common/util/directories.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stagecoach {

absl::Status EnsureWritableDirectory(const std::string& dir, absl::string_view owner) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    return absl::InternalError(absl::StrCat(owner, ": cannot create directory ", dir, ": ",
                                            error ? error.message() : "not a directory"));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InternalError(
        absl::StrCat(owner, ": directory ", dir, " is not writable: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MakePrivateTempDirectory(absl::string_view prefix,
                                                     absl::string_view owner) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string templ =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/", prefix, "-XXXXXX");
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return absl::InternalError(absl::StrCat(owner, ": cannot create a directory like ", templ, ": ",
                                            std::strerror(errno)));
  }
  return std::string(buf.data());
}

}  // namespace stagecoach
