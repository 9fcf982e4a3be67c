#include "common/process/config_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagecoach {

absl::StatusOr<std::map<std::string, std::string>> LoadConfigFile(
    const std::string& path, const std::set<std::string>& allowed) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--config: cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": invalid YAML: ", e.msg));
  }
  std::map<std::string, std::string> out;
  if (root.IsNull()) return out;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": must be a mapping of option: value"));
  }
  for (const auto& entry : root) {
    std::string key = entry.first.as<std::string>();
    std::replace(key.begin(), key.end(), '_', '-');
    if (allowed.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", key, ": unknown option (valid: ", absl::StrJoin(allowed, ", "), ")"));
    }
    if (!entry.second.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ": must be a scalar"));
    }
    out[key] = entry.second.as<std::string>();
  }
  return out;
}

}  // namespace stagecoach
