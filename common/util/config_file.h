// Daemon configuration files (--config FILE): a flat YAML mapping whose keys are the daemon's
// long flag names with '_' or '-' ("lease: 10s", "listen: 0.0.0.0:7070"). A flag given on the
// command line wins over the file.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagecoach {

// Reads `path`. INVALID_ARGUMENT naming the file and key for a key not in `allowed` (written
// with '-'), a value that is not a scalar, or invalid YAML; NOT_FOUND for a missing file.
// Keys in the result use '-'.
absl::StatusOr<std::map<std::string, std::string>> LoadConfigFile(
    const std::string& path, const std::set<std::string>& allowed);

// One option a config file may set.
struct ConfigOption {
  std::string key;                   // long flag name without "--", e.g. "heartbeat-interval"
  std::string* value;                // where the flag's value lives
  bool set_on_command_line = false;  // then the file does not override it
};

// Loads `path` (as LoadConfigFile, allowing exactly the keys of `options`) and stores each
// value the file gives into its option, unless that option was set on the command line.
absl::Status ApplyConfigFile(const std::string& path, const std::vector<ConfigOption>& options);

}  // namespace stagecoach
