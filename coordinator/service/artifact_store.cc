// The coordinator's content-addressed artifact store (see artifact_store.h).
#include "coordinator/service/artifact_store.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/util/directories.h"
#include "common/util/status_macros.h"

namespace stagecoach::coordinator {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kTempPrefix = ".upload-";

}  // namespace

std::string ArtifactUri(absl::string_view id) { return absl::StrCat(kArtifactUriPrefix, id); }

absl::StatusOr<std::unique_ptr<ArtifactStore>> ArtifactStore::Open(ArtifactStoreOptions options) {
  if (options.max_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact store: max_bytes must be >= 1, got ", options.max_bytes));
  }
  std::string dir = options.dir;
  const bool owns_dir = dir.empty();
  if (owns_dir) {
    ASSIGN_OR_RETURN(dir, MakePrivateTempDirectory("stagecoach-artifacts", "artifact store"));
  } else {
    RETURN_IF_ERROR(EnsureWritableDirectory(dir, "artifact store"));
    // Uploads that were in progress when an earlier coordinator stopped.
    std::error_code error;
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
      if (absl::StartsWith(it->path().filename().string(), kTempPrefix)) {
        std::error_code ignored;
        fs::remove(it->path(), ignored);
      }
    }
    if (error) {
      return absl::InternalError(
          absl::StrCat("artifact store: cannot list directory ", dir, ": ", error.message()));
    }
  }
  return std::unique_ptr<ArtifactStore>(new ArtifactStore(dir, owns_dir, options.max_bytes));
}

ArtifactStore::~ArtifactStore() {
  if (!owns_dir_) return;
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

absl::StatusOr<std::unique_ptr<ArtifactStore::Upload>> ArtifactStore::BeginUpload(
    absl::string_view name, int64_t size_bytes, absl::string_view sha256) {
  if (size_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.size_bytes: must be >= 0, got ", size_bytes));
  }
  if (size_bytes > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("header.size_bytes: ", size_bytes,
                                                     " bytes is over the upload limit of ",
                                                     max_bytes_, " bytes"));
  }
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.sha256: must be 64 lowercase hex digits, got '", sha256.substr(0, 80), "'"));
  }
  std::string base = fs::path(std::string(name)).filename().string();
  // The same bytes may be uploaded again (or concurrently): replacing the file is harmless.
  DurableFileOptions file_options;
  file_options.what = "artifact";
  file_options.temp_prefix = std::string(kTempPrefix);
  auto file = DurableFileWriter::Create(absl::StrCat(dir_, "/", sha256), file_options);
  if (!file.ok()) {
    return absl::InternalError(absl::StrCat("artifact store: ", file.status().message()));
  }
  return std::unique_ptr<Upload>(
      new Upload(this, std::move(base), size_bytes, std::string(sha256), *std::move(file)));
}

absl::StatusOr<ArtifactInfo> ArtifactStore::Put(absl::string_view name, absl::string_view bytes,
                                                absl::string_view sha256) {
  auto upload = BeginUpload(name, static_cast<int64_t>(bytes.size()), sha256);
  if (!upload.ok()) return upload.status();
  if (absl::Status s = (*upload)->Append(bytes); !s.ok()) return s;
  return (*upload)->Commit();
}

absl::StatusOr<ArtifactInfo> ArtifactStore::Lookup(absl::string_view id_or_uri) const {
  absl::string_view id = id_or_uri;
  absl::ConsumePrefix(&id, kArtifactUriPrefix);
  if (!IsSha256Hex(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact id '", id_or_uri.substr(0, 100),
                     "': must be 64 lowercase hex digits (a SHA-256) or artifact:<those>"));
  }
  ArtifactInfo info;
  info.id = std::string(id);
  info.uri = ArtifactUri(id);
  info.path = absl::StrCat(dir_, "/", id);
  std::error_code error;
  const auto size = fs::file_size(info.path, error);
  if (error) {
    return absl::NotFoundError(absl::StrCat("artifact ", id, ": not in the coordinator's store"));
  }
  info.size_bytes = static_cast<int64_t>(size);
  absl::MutexLock lock(&mu_);
  auto it = names_.find(info.id);
  info.name = it == names_.end() ? info.id : it->second;
  return info;
}

ArtifactStore::Upload::Upload(ArtifactStore* store, std::string name, int64_t size_bytes,
                              std::string sha256, std::unique_ptr<DurableFileWriter> file)
    : store_(store),
      name_(std::move(name)),
      size_bytes_(size_bytes),
      sha256_(std::move(sha256)),
      file_(std::move(file)) {}

ArtifactStore::Upload::~Upload() {
  if (!done_) Discard();
}

void ArtifactStore::Upload::Discard() {
  done_ = true;
  file_->Discard();
}

absl::Status ArtifactStore::Upload::Append(absl::string_view bytes) {
  if (done_) return absl::FailedPreconditionError("artifact upload: already finished");
  const int64_t total = received_ + static_cast<int64_t>(bytes.size());
  if (total > store_->max_bytes_) {
    Discard();
    return absl::ResourceExhaustedError(absl::StrCat("upload of ", name_, ": ", total,
                                                     " bytes is over the upload limit of ",
                                                     store_->max_bytes_, " bytes"));
  }
  if (total > size_bytes_) {
    Discard();
    return absl::InvalidArgumentError(absl::StrCat("size: ", name_, " sent more bytes (at least ",
                                                   total, ") than the header's size_bytes (",
                                                   size_bytes_, ")"));
  }
  if (absl::Status written = file_->Append(bytes); !written.ok()) {
    Discard();
    return absl::InternalError(absl::StrCat("artifact store: ", written.message()));
  }
  hash_.Update(bytes);
  received_ = total;
  return absl::OkStatus();
}

absl::StatusOr<ArtifactInfo> ArtifactStore::Upload::Commit() {
  if (done_) return absl::FailedPreconditionError("artifact upload: already finished");
  if (received_ != size_bytes_) {
    Discard();
    return absl::InvalidArgumentError(absl::StrCat("size: the header of ", name_, " says ",
                                                   size_bytes_, " bytes, but ", received_,
                                                   " arrived"));
  }
  const std::string got = hash_.FinalHex();
  if (got != sha256_) {
    Discard();
    return absl::InvalidArgumentError(absl::StrCat("sha256: the header of ", name_, " says ",
                                                   sha256_, ", but the bytes that arrived hash to ",
                                                   got));
  }
  // Atomic: readers see the old complete file (same bytes) or the new one.
  if (absl::Status committed = file_->Commit(); !committed.ok()) {
    Discard();
    return absl::InternalError(absl::StrCat("artifact store: ", committed.message()));
  }
  done_ = true;
  const std::string& final_path = file_->path();
  ArtifactInfo info;
  info.id = sha256_;
  info.uri = ArtifactUri(sha256_);
  info.name = name_.empty() ? sha256_ : name_;
  info.size_bytes = size_bytes_;
  info.path = final_path;
  absl::MutexLock lock(&store_->mu_);
  store_->names_[info.id] = info.name;
  return info;
}

}  // namespace stagecoach::coordinator
