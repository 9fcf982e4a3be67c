// Daemon configuration files (--config FILE): a flat YAML mapping whose keys are the daemon's
// long flag names with '_' or '-' ("lease: 10s", "listen: 0.0.0.0:7070"). The daemons read them
// through common/daemon/flag_set.h, which lets a flag given on the command line win.
#pragma once

#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"

namespace stagecoach {

// Reads `path`. INVALID_ARGUMENT naming the file and key for a key not in `allowed` (written
// with '-'), a value that is not a scalar, or invalid YAML; NOT_FOUND for a missing file.
// Keys in the result use '-'.
absl::StatusOr<std::map<std::string, std::string>> LoadConfigFile(
    const std::string& path, const std::set<std::string>& allowed);

}  // namespace stagecoach
