// The worker's cache of artifacts uploaded to the coordinator (stagectl submit --model/--data):
// turns a spec's file reference into a path on this worker. "artifact:<sha256>" is fetched from
// the coordinator once into `<cache dir>/<sha256>` (streamed to a temporary file, verified
// against its SHA-256, then renamed into place) and served from there afterwards; any other
// reference is a path on the worker's filesystem and comes back unchanged. No LibTorch.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "worker/runtime/task/task_runner.h"

namespace stagecoach::worker {

// Where the cache gets artifacts it does not hold: the coordinator (CoordinatorClient).
class ArtifactSource {
 public:
  virtual ~ArtifactSource() = default;
  // Streams artifact `id`: returns its header after passing its bytes, in order, to
  // `on_chunk` (an error from on_chunk ends the fetch with that error). The whole fetch gives
  // up after `timeout`. NOT_FOUND for an id the source does not hold.
  virtual absl::StatusOr<v1::ArtifactHeader> FetchArtifact(
      const std::string& id, absl::Duration timeout,
      const std::function<absl::Status(absl::string_view chunk)>& on_chunk) = 0;
};

struct ArtifactCacheOptions {
  // Directory of the cached files; created when missing. Empty: a private directory under
  // $TMPDIR (or /tmp) that the cache creates and removes again when it is destroyed.
  std::string dir;
  // Bound on one fetch from the source, and on waiting for another thread's fetch of the same
  // artifact.
  absl::Duration fetch_timeout = absl::Minutes(5);
};

// Thread-safe: concurrent resolves of one artifact fetch it once; the others wait for that
// fetch. Several processes may share one directory (each writes its own temporary files and
// renames them into place).
class ArtifactCache {
 public:
  // Creates the directory. INTERNAL naming it when it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<ArtifactCache>> Open(ArtifactCacheOptions options,
                                                             ArtifactSource* source);
  ~ArtifactCache();
  ArtifactCache(const ArtifactCache&) = delete;
  ArtifactCache& operator=(const ArtifactCache&) = delete;

  // A path on this worker for `ref` (see the file comment). Errors name `ref`: INVALID_ARGUMENT
  // for "artifact:" followed by something that is not a SHA-256; the source's error (e.g.
  // NOT_FOUND) when the fetch fails; DATA_LOSS when the bytes do not match the id.
  absl::StatusOr<std::string> Resolve(const std::string& ref);

  // Resolve, as a runtime::FileResolver (TaskRunnerDeps::resolve_file). The cache must outlive
  // the resolver's uses.
  runtime::FileResolver Resolver();

  const std::string& dir() const { return dir_; }

 private:
  ArtifactCache(std::string dir, bool owns_dir, ArtifactCacheOptions options,
                ArtifactSource* source)
      : dir_(std::move(dir)), owns_dir_(owns_dir), options_(options), source_(source) {}

  // Fetches `id` into dir_/id through a temporary file.
  absl::Status Fetch(const std::string& id);

  const std::string dir_;
  const bool owns_dir_;
  const ArtifactCacheOptions options_;
  ArtifactSource* const source_;
  absl::Mutex mu_;
  // Ids being fetched right now.
  std::set<std::string> fetching_ ABSL_GUARDED_BY(mu_);
  int64_t next_temp_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stagecoach::worker
