// A test's private directory: a fresh directory under $TMPDIR (or /tmp), removed with its
// contents when the TempDir goes away. Header-only, so that any test binary can use it.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace stagecoach::testing {

class TempDir {
 public:
  // The directory is named "<prefix>-XXXXXX"; path() is empty if it could not be made (the
  // test's first file operation then fails, naming it).
  explicit TempDir(absl::string_view prefix = "stagecoach-test") {
    const char* base = std::getenv("TMPDIR");
    std::string templ = absl::StrCat(base != nullptr ? base : "/tmp", "/", prefix, "-XXXXXX");
    if (mkdtemp(templ.data()) != nullptr) path_ = templ;
  }
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace stagecoach::testing
