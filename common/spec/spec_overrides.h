// Edits a job spec's YAML text before it is parsed, for requests that fix some of its fields
// themselves (CoordinatorService.Infer sets the schedule, batch size and steps).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::spec {

struct SpecOverrides {
  // Dotted field paths of nested mappings ("training.batch_size") and the scalar to store
  // there, as YAML text ("10", "ForwardOnly"); missing mappings on the way are created.
  std::vector<std::pair<std::string, std::string>> set;
  // Dotted field paths to delete (absent ones are fine).
  std::vector<std::string> remove;
};

// Returns `yaml_text` with `overrides` applied, as YAML text for ParseJobSpec; comments and
// formatting are not kept. A document ParseJobSpec would reject as a whole (a YAML syntax
// error, an empty document, not a mapping, several documents) gives ParseJobSpec's error.
// INVALID_ARGUMENT `<path>: must be a mapping` when a path crosses a value that is not one.
absl::StatusOr<std::string> ApplySpecOverrides(absl::string_view yaml_text,
                                               absl::string_view origin,
                                               const SpecOverrides& overrides);

}  // namespace stagecoach::spec
