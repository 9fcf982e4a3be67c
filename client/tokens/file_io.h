// The files `stagectl tokens` and stagecoach-sentencepiece read and write: whole files in, and
// out durably (common/util/durable_file.h: a temporary file beside the target, synced, renamed
// into place). Only the standard library and Abseil, so that the SentencePiece tool, which may
// not link stagecoach_common (tokens_command.h says why), compiles them too.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::client {

// The whole file at `path`. NOT_FOUND "cannot read <what> <path>"; DATA_LOSS when reading fails.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what);

// `contents` into `path`, durably; errors name `what` and the path.
absl::Status WriteWholeFile(const std::string& path, absl::string_view contents,
                            absl::string_view what);

}  // namespace stagecoach::client
