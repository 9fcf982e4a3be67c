// Directories a daemon keeps files in: one given by a flag (created when missing), or a private
// temporary one it creates for itself.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach {

// Creates `dir` and its parents unless it is already a directory, then checks that it is
// writable. INTERNAL naming `owner` (e.g. "artifact store") and the directory otherwise.
absl::Status EnsureWritableDirectory(const std::string& dir, absl::string_view owner);

// Creates a new private directory $TMPDIR/<prefix>-XXXXXX (/tmp without TMPDIR) and returns its
// path; the caller removes it. INTERNAL naming `owner` when it cannot.
absl::StatusOr<std::string> MakePrivateTempDirectory(absl::string_view prefix,
                                                     absl::string_view owner);

}  // namespace stagecoach
