// What stagectl does to a spec file's text before it sends it: checks that it is UTF-8,
// inlines the schedule CSV file it names (schedule.csv_text), and looks for model.builtin. No
// RPC here.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::client {

// Empty when `text` is valid UTF-8 (a protobuf string must be: the coordinator would not even
// read the request), else what is wrong and where: "spec file 'a.yaml' is not UTF-8 text: the
// byte at line 3, column 7 (byte 40): 0xFF is not valid UTF-8".
std::string Utf8Problem(absl::string_view text, absl::string_view what);

// For a spec with `schedule.csv: PATH`, the spec text with `schedule.csv_text` (the file's
// contents) inserted just before the csv key, so that the rest of the user's text stays as
// written. PATH is read relative to the spec file's directory. Anything else (no schedule.csv,
// csv_text already there, text that is not YAML) comes back unchanged for the coordinator to
// judge. The error says which file cannot be read.
absl::StatusOr<std::string> InlineScheduleCsv(const std::string& spec_text,
                                              const std::string& spec_path);

// Whether the spec text has a model.builtin entry (text that is not YAML: no).
bool HasBuiltinModel(const std::string& spec_text);

}  // namespace stagecoach::client
