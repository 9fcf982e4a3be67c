// The worker's compute thread policy (worker/runtime/device/compute_threads.h): cgroup quotas read
// from their files' text, the CPUs allowed, the threads chosen with and without --threads, and the
// count set per calling thread.
#include "worker/runtime/device/compute_threads.h"

#include <ATen/Parallel.h>

#include <thread>

#include "gtest/gtest.h"

namespace stagecoach::runtime::compute_threads_test {
namespace {

TEST(CgroupQuota, V2CpuMaxIsQuotaOverPeriodAndMaxIsNone) {
  EXPECT_EQ(ParseCgroupV2CpuMax("max 100000\n"), std::nullopt);
  EXPECT_DOUBLE_EQ(ParseCgroupV2CpuMax("150000 100000\n").value(), 1.5);
  EXPECT_DOUBLE_EQ(ParseCgroupV2CpuMax("400000 100000").value(), 4.0);
  EXPECT_EQ(ParseCgroupV2CpuMax(""), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("100000"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("abc 100000"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("100000 0"), std::nullopt);
}

TEST(CgroupQuota, V1MinusOneIsNone) {
  EXPECT_EQ(ParseCgroupV1Quota("-1\n", "100000\n"), std::nullopt);
  EXPECT_DOUBLE_EQ(ParseCgroupV1Quota("200000\n", "100000\n").value(), 2.0);
  EXPECT_EQ(ParseCgroupV1Quota("", ""), std::nullopt);
}

TEST(ComputeThreads, AllowedCpusIsTheAffinityCappedByTheQuotaAndAtLeastOne) {
  EXPECT_EQ(AllowedCpus({8, std::nullopt}), 8);
  EXPECT_EQ(AllowedCpus({8, 2.5}), 2);
  EXPECT_EQ(AllowedCpus({2, 16.0}), 2);
  EXPECT_EQ(AllowedCpus({8, 0.5}), 1);
  EXPECT_EQ(AllowedCpus({0, std::nullopt}), 1);
}

TEST(ComputeThreads, ThreadsFlagWinsElseTheCpusAreSharedByTheRanksOnTheHost) {
  EXPECT_EQ(ChooseComputeThreads(3, {16, std::nullopt}, 4), 3);
  EXPECT_EQ(ChooseComputeThreads(0, {16, std::nullopt}, 4), 4);
  EXPECT_EQ(ChooseComputeThreads(0, {8, std::nullopt}, 3), 2);
  EXPECT_EQ(ChooseComputeThreads(0, {2, std::nullopt}, 4), 1);
  EXPECT_EQ(ChooseComputeThreads(0, {8, 4.0}, 1), 4);
  EXPECT_EQ(ChooseComputeThreads(0, {8, std::nullopt}, 0), 8);  // an older coordinator: 0
  EXPECT_EQ(DescribeComputeThreads(0, {8, 4.0}, 2),
            "2 compute threads (8 CPUs in the affinity mask, a cgroup quota of 4; 2 of the job's "
            "ranks on this host)");
  EXPECT_EQ(DescribeComputeThreads(3, {8, 4.0}, 2), "3 compute threads (--threads)");
}

TEST(ComputeThreads, ReadCpuAllowanceSeesThisProcessesCpus) {
  const CpuAllowance allowance = ReadCpuAllowance();
  EXPECT_GE(allowance.affinity_cpus, 1);
  EXPECT_LE(allowance.affinity_cpus, static_cast<int>(std::thread::hardware_concurrency()));
  if (allowance.quota_cpus.has_value()) {
    EXPECT_GT(*allowance.quota_cpus, 0.0);
  }
}

TEST(ComputeThreads, UseComputeThreadsSetsLibTorchsCountOnTheCallingThread) {
  int seen = 0;
  std::thread worker([&seen] {
    UseComputeThreads(1);
    seen = at::get_num_threads();
  });
  worker.join();
  EXPECT_EQ(seen, 1);
  std::thread zero([&seen] {
    UseComputeThreads(0);  // never below one
    seen = at::get_num_threads();
  });
  zero.join();
  EXPECT_EQ(seen, 1);
}

}  // namespace
}  // namespace stagecoach::runtime::compute_threads_test
