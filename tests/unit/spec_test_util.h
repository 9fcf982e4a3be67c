// What the spec parser's tests share: a valid base spec that each test edits in one place, and
// the parse outcomes as test expectations.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/spec/spec_parser.h"
#include "gtest/gtest.h"

namespace stagecoach::spec {

// A valid spec; each test changes one thing with Edit().
inline constexpr char kBase[] = R"(name: test-job
model:
  builtin: {family: mlp, sizes: [8, 16, 16, 16, 4]}
split:
  stages: 2
schedule:
  kind: 1F1B
  microbatches: 4
placement:
  workers: 2
training:
  batch_size: 8
  optimizer: {kind: sgd, lr: 0.1}
data:
  kind: synthetic
)";

// `text` with the one occurrence of `from` replaced by `to`.
inline std::string Edit(absl::string_view text, absl::string_view from, absl::string_view to) {
  std::string out(text);
  const size_t at = out.find(std::string(from));
  if (at == std::string::npos || out.find(std::string(from), at + 1) != std::string::npos) {
    ADD_FAILURE() << "'" << from << "' is not in the spec exactly once";
    return out;
  }
  out.replace(at, from.size(), std::string(to));
  return out;
}

// The error lines of a spec that must be rejected.
inline std::vector<std::string> Errors(absl::string_view yaml, absl::string_view origin = "spec") {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, origin);
  if (spec.ok()) {
    ADD_FAILURE() << "accepted:\n" << yaml;
    return {};
  }
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return absl::StrSplit(spec.status().message(), '\n');
}

// The parsed spec of a spec that must be accepted.
inline JobSpec Parsed(absl::string_view yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status().message() << "\nin:\n" << yaml;
    return {};
  }
  return *std::move(spec);
}

}  // namespace stagecoach::spec
