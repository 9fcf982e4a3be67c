// Loading YAML text as documents without yaml-cpp 0.7's endless loop: on some malformed input
// (two bytes, ",\n", do it) YAML::LoadAll keeps producing empty documents without reading on,
// and never returns while its memory grows (jbeder/yaml-cpp#1319, fixed in 0.8; Debian 12 ships
// 0.7; found by tests/fuzz/spec_parser_fuzz). Here the documents are first walked with the
// parser's own events, a bounded number of them, and a document that starts where the previous
// one started is refused as YAML the parser cannot read past; only then are they loaded.
#pragma once

#include <yaml-cpp/yaml.h>

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::spec {

// The YAML documents of `text`. INVALID_ARGUMENT "<origin>:L:C: invalid YAML: ..." for text that
// is not YAML (or that the parser cannot read past), and "<origin>: expected at most N YAML
// documents, got M" (M counted up to N + 1) for more than `max_documents`.
absl::StatusOr<std::vector<YAML::Node>> LoadYamlDocuments(absl::string_view text,
                                                          absl::string_view origin,
                                                          int max_documents);

}  // namespace stagecoach::spec
