// Durable files: a file appears at its path whole or not at all, and once a write returned OK it
// survives a crash of the process or the machine. The bytes go to a temporary file in the
// target's directory (same filesystem, so the last step is atomic) and are fsync'ed; then the
// temporary file is renamed over the target (IfExists::kReplace) or linked to it
// (IfExists::kFail: refused when the target exists, also when another writer got there first),
// and the directory is fsync'ed so that the new name is on disk too.
//
// Used for the job table, checkpoint stage files and manifests, and committed artifact uploads.
// No lock: distinct targets are independent; of concurrent kReplace writers of one target one
// whole file wins; of concurrent kFail writers exactly one succeeds.
//
// Errors name the file, the step that failed and the system's reason (strerror). Codes by errno:
// PERMISSION_DENIED (EACCES, EPERM, EROFS), NOT_FOUND (ENOENT, ENOTDIR: no such directory),
// RESOURCE_EXHAUSTED (ENOSPC, EDQUOT), DATA_LOSS for any other I/O error; ALREADY_EXISTS with
// kFail when the target exists. On an error the temporary file is removed and the target is as
// it was, except when only the final directory fsync failed (DATA_LOSS naming the directory):
// then the new file is in place but may not survive a machine crash.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach {

struct DurableFileOptions {
  enum class IfExists {
    kReplace,  // rename over an existing target
    kFail,     // ALREADY_EXISTS "<what> <path> already exists; it is not overwritten"
  };
  IfExists if_exists = IfExists::kReplace;
  // Permission bits of the new file (before the umask).
  mode_t mode = 0644;
  // How errors name the file: "<what> <path>: ...", e.g. "checkpoint manifest".
  std::string what = "file";
  // Name of the temporary file in the target's directory: "<temp_prefix><pid>-<n>.tmp". Empty:
  // "." followed by the target's base name and "." (a hidden file beside the target). A store
  // that removes leftovers of a crash by prefix sets its own.
  std::string temp_prefix;
};

// A status for a failed system call whose errno is `err`: `message` (naming what failed),
// ": ", and strerror(err), with the code the table above gives.
absl::Status ErrnoStatus(int err, absl::string_view message);

// Writes `contents` to `path` durably (see above).
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents,
                              const DurableFileOptions& options = {});

// A durable file written in pieces (an upload that arrives in chunks): Create opens the
// temporary file, Append adds bytes, Commit makes it the target. Destroying a writer that was
// not committed, or whose Commit failed, removes the temporary file. Not thread-safe; distinct
// writers are independent.
class DurableFileWriter {
 public:
  // Creates the temporary file for `path` (nothing appears at `path` yet). With kFail,
  // ALREADY_EXISTS when `path` exists already; errors as above.
  static absl::StatusOr<std::unique_ptr<DurableFileWriter>> Create(std::string path,
                                                                   DurableFileOptions options = {});
  ~DurableFileWriter();
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;

  // Appends `bytes` to the temporary file. After an error the writer is discarded.
  absl::Status Append(absl::string_view bytes);
  // Flushes the temporary file to disk, moves it to the target and flushes the directory.
  // Call once; FAILED_PRECONDITION after a Commit, a Discard or a failed Append.
  absl::Status Commit();
  // Removes the temporary file; the target is left as it was. Idempotent.
  void Discard();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  int64_t bytes_written() const { return bytes_written_; }

 private:
  DurableFileWriter(std::string path, std::string temp_path, int fd, DurableFileOptions options);

  // Puts the flushed temporary file at path_ as options_.if_exists says.
  absl::Status MoveIntoPlace();

  const std::string path_;
  const std::string temp_path_;
  const DurableFileOptions options_;
  int fd_;  // -1 once closed
  int64_t bytes_written_ = 0;
  bool finished_ = false;  // committed or discarded
};

}  // namespace stagecoach
