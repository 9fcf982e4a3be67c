#include "worker/runtime/device/compute_slice.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace stagecoach::runtime {
namespace {

// The kernel's struct sched_attr (include/uapi/linux/sched/types.h); glibc has no wrapper.
struct SchedAttr {
  uint32_t size = sizeof(SchedAttr);
  uint32_t sched_policy = 0;
  uint64_t sched_flags = 0;
  int32_t sched_nice = 0;
  uint32_t sched_priority = 0;
  uint64_t sched_runtime = 0;
  uint64_t sched_deadline = 0;
  uint64_t sched_period = 0;
  uint32_t sched_util_min = 0;
  uint32_t sched_util_max = 0;
};

}  // namespace

TimeSliceResult RequestTimeSlice(absl::Duration slice) {
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  SchedAttr attr;
  if (syscall(SYS_sched_getattr, tid, &attr, sizeof(attr), 0) != 0) {
    return {false, absl::StrCat("kernel time slice (sched_getattr: ", std::strerror(errno), ")")};
  }
  if (attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH) {
    return {false, "kernel time slice (not a SCHED_OTHER thread)"};
  }
  const uint64_t wanted = static_cast<uint64_t>(absl::ToInt64Nanoseconds(slice));
  attr.size = sizeof(attr);
  attr.sched_flags = 0;
  attr.sched_runtime = wanted;  // sched_nice and the policy as they are
  if (syscall(SYS_sched_setattr, tid, &attr, 0) != 0) {
    return {false, absl::StrCat("kernel time slice (sched_setattr: ", std::strerror(errno), ")")};
  }
  SchedAttr now;
  if (syscall(SYS_sched_getattr, tid, &now, sizeof(now), 0) != 0 || now.sched_runtime != wanted) {
    return {false, "kernel time slice (this kernel keeps its own: Linux >= 6.12 takes a request)"};
  }
  return {true, absl::StrCat("time slice ", absl::FormatDuration(slice))};
}

}  // namespace stagecoach::runtime
