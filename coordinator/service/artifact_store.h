// The coordinator's artifact store: files clients upload (TorchScript models, small datasets),
// kept content-addressed under `<dir>/<sha256>` so that a spec can name one as
// "artifact:<sha256>" and workers can fetch it (CoordinatorService.UploadArtifact /
// FetchArtifact). An upload streams into a temporary file in the same directory and becomes
// visible only after its size and SHA-256 were verified, durably (common/util/durable_file.h:
// flushed, renamed into place, the directory flushed): nothing half-written is ever found by
// Lookup. No LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/util/durable_file.h"
#include "common/util/sha256.h"

namespace stagecoach::coordinator {

// How a spec names an uploaded file: kArtifactUriPrefix followed by its id (its SHA-256).
inline constexpr absl::string_view kArtifactUriPrefix = "artifact:";

// "artifact:<id>".
std::string ArtifactUri(absl::string_view id);

struct ArtifactStoreOptions {
  // Directory holding the artifacts; created when missing. Empty: a private directory under
  // $TMPDIR (or /tmp) that the store creates and removes again when it is destroyed.
  std::string dir;
  // Largest artifact accepted, in bytes (1 GiB by default).
  int64_t max_bytes = int64_t{1} << 30;
};

// What the store knows about one stored artifact.
struct ArtifactInfo {
  std::string id;    // SHA-256 of the bytes, 64 lowercase hex digits
  std::string uri;   // "artifact:<id>"
  std::string name;  // base name it was last uploaded under ("<id>" when unknown)
  int64_t size_bytes = 0;
  std::string path;  // the file holding the bytes
};

// Thread-safe: uploads, lookups and fetches may run concurrently, also of the same bytes.
class ArtifactStore {
 public:
  // Opens (creating when needed) the store's directory and removes temporary files a crashed
  // upload left behind. INVALID_ARGUMENT for max_bytes < 1; INTERNAL naming the directory when
  // it cannot be created or used.
  static absl::StatusOr<std::unique_ptr<ArtifactStore>> Open(ArtifactStoreOptions options);
  // Removes the directory when the store created it itself (options.dir was empty).
  ~ArtifactStore();
  ArtifactStore(const ArtifactStore&) = delete;
  ArtifactStore& operator=(const ArtifactStore&) = delete;

  // One upload in progress: bytes go to a temporary file until Commit. Destroying an upload
  // that was not committed (or whose Commit failed) removes its temporary file. Not
  // thread-safe; distinct uploads are independent.
  class Upload {
   public:
    ~Upload();
    Upload(const Upload&) = delete;
    Upload& operator=(const Upload&) = delete;

    // Appends the next bytes. RESOURCE_EXHAUSTED when the total would pass the store's size
    // limit; INVALID_ARGUMENT when it would pass the header's size; INTERNAL on a write error.
    absl::Status Append(absl::string_view bytes);
    // Verifies the size and checksum against the header and makes the artifact visible.
    // INVALID_ARGUMENT naming what differs (size: both byte counts; sha256: both digests);
    // nothing is stored then. Call once.
    absl::StatusOr<ArtifactInfo> Commit();

    int64_t bytes_received() const { return received_; }

   private:
    friend class ArtifactStore;
    Upload(ArtifactStore* store, std::string name, int64_t size_bytes, std::string sha256,
           std::unique_ptr<DurableFileWriter> file);
    void Discard();

    ArtifactStore* const store_;
    const std::string name_;
    const int64_t size_bytes_;
    const std::string sha256_;
    const std::unique_ptr<DurableFileWriter> file_;  // the artifact's file until Commit
    Sha256 hash_;
    int64_t received_ = 0;
    bool done_ = false;
  };

  // Starts an upload of `size_bytes` bytes whose SHA-256 is `sha256` (64 lowercase hex
  // digits), uploaded from a file called `name` (a base name, for display; a path is cut to
  // its base name). RESOURCE_EXHAUSTED when size_bytes is over the limit; INVALID_ARGUMENT
  // naming the header field for a malformed header.
  absl::StatusOr<std::unique_ptr<Upload>> BeginUpload(absl::string_view name, int64_t size_bytes,
                                                      absl::string_view sha256);

  // Stores `bytes` in one go (BeginUpload, Append, Commit).
  absl::StatusOr<ArtifactInfo> Put(absl::string_view name, absl::string_view bytes,
                                   absl::string_view sha256);

  // The artifact with id `id_or_uri`, given as "<id>" or "artifact:<id>". INVALID_ARGUMENT
  // when it is neither; NOT_FOUND naming the id when the store does not hold it.
  absl::StatusOr<ArtifactInfo> Lookup(absl::string_view id_or_uri) const;

  const std::string& dir() const { return dir_; }
  int64_t max_bytes() const { return max_bytes_; }

 private:
  ArtifactStore(std::string dir, bool owns_dir, int64_t max_bytes)
      : dir_(std::move(dir)), owns_dir_(owns_dir), max_bytes_(max_bytes) {}

  const std::string dir_;
  const bool owns_dir_;
  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  // Display names of the artifacts uploaded since the store opened, by id.
  std::map<std::string, std::string> names_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagecoach::coordinator
