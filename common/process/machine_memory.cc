#include "common/process/machine_memory.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace stagecoach {
namespace {

// MemTotal from /proc/meminfo, in bytes; 0 when unreadable.
int64_t MemTotal() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

// memory.max of this process's cgroup (v2), in bytes; 0 when none or unreadable.
int64_t CgroupLimit() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(self, line)) {
    if (absl::StartsWith(line, "0::")) path = line.substr(3);
  }
  if (path.empty()) return 0;
  std::ifstream in("/sys/fs/cgroup" + path + "/memory.max");
  std::string value;
  int64_t bytes = 0;
  if (!(in >> value) || !absl::SimpleAtoi(value, &bytes)) return 0;  // "max": no limit
  return bytes;
}

}  // namespace

int64_t MachineMemoryBytes() {
  const int64_t total = MemTotal();
  const int64_t limit = CgroupLimit();
  if (total <= 0) return limit;
  if (limit <= 0) return total;
  return std::min(total, limit);
}

}  // namespace stagecoach
