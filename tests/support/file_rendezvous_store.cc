#include "tests/support/file_rendezvous_store.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stagecoach::testing {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(1);

bool ReadFile(const std::string& path, std::string* contents) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *contents = buffer.str();
  return true;
}

}  // namespace

FileRendezvousStore::FileRendezvousStore(std::string dir) : dir_(std::move(dir)) {}

std::string FileRendezvousStore::PathOf(const std::string& key) const {
  return dir_ + "/" + absl::BytesToHexString(key);
}

absl::Status FileRendezvousStore::Set(const std::string& key, const std::string& value) {
  static std::atomic<int> counter{0};
  const std::string path = PathOf(key);
  const std::string temporary =
      absl::StrFormat("%s.tmp.%d.%d", path, static_cast<int>(getpid()), counter++);
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) return absl::InternalError(absl::StrFormat("cannot write %s", temporary));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrFormat("cannot rename %s to %s: %s", temporary, path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileRendezvousStore::Get(const std::string& key,
                                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string value;
  while (!ReadFile(PathOf(key), &value)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat("rendezvous key \"%s\" not set within %s",
                                                         key, absl::FormatDuration(timeout)));
    }
    absl::SleepFor(kPollInterval);
  }
  return value;
}

absl::Status FileRendezvousStore::Wait(const std::vector<std::string>& keys,
                                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (access(PathOf(key).c_str(), F_OK) != 0) missing.push_back(key);
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrFormat("rendezvous keys not set within %s: \"%s\"",
                          absl::FormatDuration(timeout), absl::StrJoin(missing, "\", \"")));
    }
    absl::SleepFor(kPollInterval);
  }
}

}  // namespace stagecoach::testing
