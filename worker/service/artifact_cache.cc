// The worker's artifact cache (see artifact_cache.h).
#include "worker/service/artifact_cache.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/util/directories.h"
#include "common/util/logging.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"

namespace stagecoach::worker {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kUriPrefix = "artifact:";
// Extra time a resolve waits for another thread's fetch beyond that fetch's own bound.
constexpr absl::Duration kWaitMargin = absl::Seconds(10);

std::string ErrnoText() { return std::strerror(errno); }

struct NotFetching {
  const std::set<std::string>* fetching;
  const std::string* id;
  static bool Check(NotFetching* self) { return self->fetching->count(*self->id) == 0; }
};

}  // namespace

absl::StatusOr<std::unique_ptr<ArtifactCache>> ArtifactCache::Open(ArtifactCacheOptions options,
                                                                   ArtifactSource* source) {
  std::string dir = options.dir;
  const bool owns_dir = dir.empty();
  if (owns_dir) {
    ASSIGN_OR_RETURN(dir, MakePrivateTempDirectory("stagecoach-worker-cache", "artifact cache"));
  } else {
    RETURN_IF_ERROR(EnsureWritableDirectory(dir, "artifact cache"));
  }
  return std::unique_ptr<ArtifactCache>(new ArtifactCache(dir, owns_dir, options, source));
}

ArtifactCache::~ArtifactCache() {
  if (!owns_dir_) return;
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

runtime::FileResolver ArtifactCache::Resolver() {
  return [this](const std::string& ref) { return Resolve(ref); };
}

absl::StatusOr<std::string> ArtifactCache::Resolve(const std::string& ref) {
  absl::string_view id_view = ref;
  if (!absl::ConsumePrefix(&id_view, kUriPrefix)) return ref;  // a path on this worker
  const std::string id(id_view);
  if (!IsSha256Hex(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ref, ": not an artifact uri (artifact: followed by 64 lowercase hex digits)"));
  }
  const std::string path = absl::StrCat(dir_, "/", id);
  {
    absl::MutexLock lock(&mu_);
    NotFetching cond{&fetching_, &id};
    if (!mu_.AwaitWithTimeout(absl::Condition(&NotFetching::Check, &cond),
                              options_.fetch_timeout + kWaitMargin)) {
      return absl::DeadlineExceededError(
          absl::StrCat(ref, ": another fetch of this artifact did not finish in ",
                       absl::FormatDuration(options_.fetch_timeout + kWaitMargin)));
    }
    std::error_code error;
    if (fs::is_regular_file(path, error)) return path;
    fetching_.insert(id);
  }
  absl::Status fetched = Fetch(id);
  {
    absl::MutexLock lock(&mu_);
    fetching_.erase(id);
  }
  if (!fetched.ok()) {
    return absl::Status(fetched.code(), absl::StrCat(ref, ": ", fetched.message()));
  }
  return path;
}

absl::Status ArtifactCache::Fetch(const std::string& id) {
  int64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = next_temp_++;
  }
  const std::string temp = absl::StrCat(dir_, "/.fetch-", id, "-", getpid(), "-", n, ".tmp");
  std::FILE* file = std::fopen(temp.c_str(), "wbx");
  if (file == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", temp, ": ", ErrnoText()));
  }
  auto fail = [&](absl::Status status) {
    if (file != nullptr) std::fclose(file);
    file = nullptr;
    std::remove(temp.c_str());
    return status;
  };
  Sha256 hash;
  int64_t received = 0;
  const absl::Time start = absl::Now();
  auto header = source_->FetchArtifact(
      id, options_.fetch_timeout, [&](absl::string_view chunk) -> absl::Status {
        if (!chunk.empty() && std::fwrite(chunk.data(), 1, chunk.size(), file) != chunk.size()) {
          return absl::InternalError(absl::StrCat("writing ", temp, ": ", ErrnoText()));
        }
        hash.Update(chunk);
        received += static_cast<int64_t>(chunk.size());
        return absl::OkStatus();
      });
  if (!header.ok()) return fail(header.status());
  if (header->size_bytes() != received) {
    return fail(absl::DataLossError(absl::StrCat("the coordinator announced ", header->size_bytes(),
                                                 " bytes but sent ", received)));
  }
  const std::string got = hash.FinalHex();
  if (got != id) {
    return fail(absl::DataLossError(
        absl::StrCat("the fetched bytes hash to ", got, ", not to the artifact's id")));
  }
  const bool flushed = std::fflush(file) == 0 && fsync(fileno(file)) == 0;
  const bool closed = std::fclose(file) == 0;
  file = nullptr;
  if (!flushed || !closed) {
    return fail(absl::InternalError(absl::StrCat("writing ", temp, ": ", ErrnoText())));
  }
  const std::string path = absl::StrCat(dir_, "/", id);
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return fail(
        absl::InternalError(absl::StrCat("cannot move ", temp, " to ", path, ": ", ErrnoText())));
  }
  spdlog::info("fetched artifact:{} ({}, {} bytes) in {}", id, header->name(), received,
               absl::FormatDuration(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace stagecoach::worker
