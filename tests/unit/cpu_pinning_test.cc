// Compute-thread pinning (worker/runtime/device/cpu_pinning.h): pinned only where the ranks' CPUs
// cannot collide, each rank at a host to its own share of the mask; and the pinning itself.
#include "worker/runtime/device/cpu_pinning.h"

#include <pthread.h>
#include <sched.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/runtime/device/compute_threads.h"

namespace stagecoach::runtime::cpu_pinning_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

PinningInputs TwoRanksOnFourCpus(int index) {
  PinningInputs in;
  in.affinity = {0, 2, 5, 7};  // CPU numbers need not be contiguous
  in.threads = 2;
  in.ranks_on_host = 2;
  in.index_on_host = index;
  return in;
}

TEST(CpuPinning, EachRankAtTheHostTakesItsOwnShareOfTheMask) {
  const PinningChoice first = ChooseComputeCpus(TwoRanksOnFourCpus(0));
  const PinningChoice second = ChooseComputeCpus(TwoRanksOnFourCpus(1));
  EXPECT_THAT(first.cpus, ElementsAre(0, 2));
  EXPECT_THAT(second.cpus, ElementsAre(5, 7));
  EXPECT_EQ(second.why, "pinned to CPUs 5,7 (rank 2 of 2 on this host)");
  PinningInputs one_thread = TwoRanksOnFourCpus(1);
  one_thread.threads = 1;
  EXPECT_EQ(ChooseComputeCpus(one_thread).why, "pinned to CPU 2 (rank 2 of 2 on this host)");
}

TEST(CpuPinning, NotPinnedWhereCpusCouldCollideOrItIsOff) {
  PinningInputs off = TwoRanksOnFourCpus(0);
  off.enabled = false;
  PinningInputs alone = TwoRanksOnFourCpus(0);
  alone.ranks_on_host = 1;  // e.g. a pod: other pods of its node see the same CPU numbers
  PinningInputs quota = TwoRanksOnFourCpus(0);
  quota.quota = true;
  PinningInputs crowded = TwoRanksOnFourCpus(0);
  crowded.threads = 3;  // 2 x 3 > 4 CPUs
  PinningInputs stray = TwoRanksOnFourCpus(2);
  struct Case {
    PinningInputs in;
    const char* why;
  };
  for (const Case& c : {Case{off, "--no-pin-threads"}, Case{alone, "the only rank"},
                        Case{quota, "cgroup CPU quota"},
                        Case{crowded, "4 CPUs in the affinity mask for 2 ranks x 3 threads"},
                        Case{stray, "index 2 among 2"}}) {
    const PinningChoice choice = ChooseComputeCpus(c.in);
    EXPECT_THAT(choice.cpus, IsEmpty()) << c.why;
    EXPECT_THAT(choice.why, HasSubstr("not pinned")) << c.why;
    EXPECT_THAT(choice.why, HasSubstr(c.why));
  }
}

TEST(CpuPinning, PinsTheCallingThreadAndThreadsItStarts) {
  const std::vector<int> mask = AffinityMask();
  ASSERT_FALSE(mask.empty());
  std::thread([&mask] {
    ASSERT_TRUE(PinCallingThread({mask.back()}).ok());
    std::thread([&mask] {
      cpu_set_t set;
      CPU_ZERO(&set);
      ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(set), &set), 0);
      EXPECT_EQ(CPU_COUNT(&set), 1);
      EXPECT_TRUE(CPU_ISSET(mask.back(), &set));
    }).join();
  }).join();
  const absl::Status bad = PinCallingThread({-1});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("CPU -1 is out of range"));
}

}  // namespace
}  // namespace stagecoach::runtime::cpu_pinning_test
