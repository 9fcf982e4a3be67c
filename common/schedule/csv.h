// Schedules as CSV, the layout torch.distributed.pipelining's _dump_csv / _load_csv use: one row
// per rank (row r = rank r), comma-separated actions in PyTorch's syntax, an empty field for an
// idle slot. Both PyTorch formats (compute-only and compute + comms) share this layout; which
// actions a format admits is for the caller to check.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/action.h"

namespace stagecoach::schedule {

// Parses CSV text. Each line is one rank; CR before LF (PyTorch writes CRLF) is ignored, and the
// terminator of the last line is optional. An empty line is a rank without actions; a line that
// is just `""` (Python's csv module writes a lone empty field that way) is one idle slot. Fields
// may be wrapped in double quotes. Errors are INVALID_ARGUMENT naming the line (rank) and column
// and quoting the bad field.
absl::StatusOr<PipelineOrder> ParseScheduleCsv(absl::string_view text);

// Writes `order` as CSV with LF line endings, one line per rank, idle slots as empty fields
// (a rank that is a single idle slot as `""`). ParseScheduleCsv reads it back unchanged.
std::string FormatScheduleCsv(const PipelineOrder& order);

}  // namespace stagecoach::schedule
