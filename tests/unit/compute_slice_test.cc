// RequestTimeSlice (worker/runtime/device/compute_slice.h): the calling thread's slice as the
// kernel reports it afterwards, its nice value kept; kernels before 6.12 keep their own and say so.
#include "worker/runtime/device/compute_slice.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::runtime::compute_slice_test {
namespace {

using ::testing::HasSubstr;

TEST(ComputeSlice, AppliedOrSaysWhyAndKeepsTheNiceValue) {
  std::thread([] {
    const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
    ASSERT_EQ(setpriority(PRIO_PROCESS, tid, 3), 0);  // lowering priority needs no privilege
    const TimeSliceResult result = RequestTimeSlice(kComputeTimeSlice);
    if (result.applied) {
      EXPECT_EQ(result.why, "time slice 100us");
    } else {
      EXPECT_THAT(result.why, HasSubstr("kernel time slice")) << result.why;
    }
    errno = 0;
    EXPECT_EQ(getpriority(PRIO_PROCESS, tid), 3) << "the request keeps the thread's nice value";
  }).join();
}

}  // namespace
}  // namespace stagecoach::runtime::compute_slice_test
