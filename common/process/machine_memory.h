// How much memory this process's machine gives it: the physical memory, or the cgroup's limit
// when that is lower (a container's memory limit).
#pragma once

#include <cstdint>

namespace stagecoach {

// The smaller of MemTotal (/proc/meminfo) and the cgroup v2 limit (memory.max of the process's
// cgroup; "max" is none), in bytes; 0 when neither can be read.
int64_t MachineMemoryBytes();

}  // namespace stagecoach
