#include "common/spec/spec_overrides.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/spec/spec_parser.h"
#include "common/spec/yaml_documents.h"

namespace stagecoach::spec {
namespace {

// The error ParseJobSpec gives for a document it rejects as a whole.
absl::Status DocumentError(absl::string_view yaml_text, absl::string_view origin) {
  auto parsed = ParseJobSpec(yaml_text, origin);
  if (!parsed.ok()) return parsed.status();
  return absl::InvalidArgumentError(absl::StrCat(origin, ": not a single YAML mapping"));
}

// Walks `path` (dotted), creating mappings when `create`. Returns the parent mapping of the
// last key, or an undefined node when a mapping on the way is absent and not created.
absl::StatusOr<YAML::Node> Parent(YAML::Node root, const std::vector<std::string>& keys,
                                  bool create) {
  YAML::Node node = root;
  std::string path;
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    absl::StrAppend(&path, path.empty() ? "" : ".", keys[i]);
    YAML::Node child = node[keys[i]];
    if (!child.IsDefined() || child.IsNull()) {
      if (!create) return YAML::Node(YAML::NodeType::Undefined);
      node[keys[i]] = YAML::Node(YAML::NodeType::Map);
      child.reset(node[keys[i]]);  // rebinds; operator= would assign through
    } else if (!child.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": must be a mapping"));
    }
    node.reset(child);
  }
  return node;
}

}  // namespace

absl::StatusOr<std::string> ApplySpecOverrides(absl::string_view yaml_text,
                                               absl::string_view origin,
                                               const SpecOverrides& overrides) {
  absl::StatusOr<std::vector<YAML::Node>> loaded = LoadYamlDocuments(yaml_text, origin, 1);
  if (!loaded.ok()) return DocumentError(yaml_text, origin);
  std::vector<YAML::Node>& docs = *loaded;
  if (docs.size() != 1 || !docs[0].IsMap()) return DocumentError(yaml_text, origin);
  YAML::Node root = docs[0];
  try {
    for (const std::string& path : overrides.remove) {
      const std::vector<std::string> keys = absl::StrSplit(path, '.');
      auto parent = Parent(root, keys, /*create=*/false);
      if (!parent.ok()) return parent.status();
      if (parent->IsMap()) parent->remove(keys.back());
    }
    for (const auto& [path, value] : overrides.set) {
      const std::vector<std::string> keys = absl::StrSplit(path, '.');
      auto parent = Parent(root, keys, /*create=*/true);
      if (!parent.ok()) return parent.status();
      (*parent)[keys.back()] = value;
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", e.what()));
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace stagecoach::spec
