// A rank's progress beacon (worker/runtime/executor/progress_beacon.h) on an injected clock.
#include "worker/runtime/executor/progress_beacon.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stagecoach::runtime {
namespace {

TEST(ProgressBeacon, ReadSaysThePhaseActionAndWaitWithHowLongEachHasLasted) {
  absl::Time now = absl::FromUnixSeconds(100);
  ProgressBeacon beacon("job-4", 2, 1, 0, [&] { return now; });
  v1::RankProgress p = beacon.Read();
  EXPECT_EQ(p.job_id(), "job-4");
  EXPECT_EQ(p.attempt(), 2);
  EXPECT_EQ(p.rank(), 1);
  EXPECT_EQ(p.phase(), v1::RANK_PHASE_SETUP);

  beacon.BeginStep(7);
  now += absl::Milliseconds(10);
  beacon.BeginAction("1F0");
  now += absl::Milliseconds(5);
  beacon.BeginWait("RECV_F", 1, 0, 0, 42);
  now += absl::Seconds(3);
  p = beacon.Read();
  EXPECT_EQ(p.global_step(), 7);
  EXPECT_EQ(p.phase(), v1::RANK_PHASE_ACTIONS);
  EXPECT_EQ(p.step_elapsed_us(), 3'015'000);
  EXPECT_EQ(p.action(), "1F0");
  EXPECT_EQ(p.action_elapsed_us(), 3'005'000);
  ASSERT_TRUE(p.has_wait());
  EXPECT_EQ(p.wait().kind(), "RECV_F");
  EXPECT_EQ(p.wait().peer_rank(), 0);
  EXPECT_EQ(p.wait().tag(), 42u);
  EXPECT_EQ(p.wait().waited_us(), 3'000'000);

  beacon.EndWait();
  now += absl::Milliseconds(20);
  beacon.EndAction(absl::Seconds(3));
  p = beacon.Read();
  EXPECT_FALSE(p.has_wait());
  EXPECT_TRUE(p.action().empty());
  ASSERT_EQ(p.recent_size(), 1);
  EXPECT_EQ(p.recent(0).action(), "1F0");
  EXPECT_EQ(p.recent(0).global_step(), 7);
  EXPECT_EQ(p.recent(0).duration_us(), 3'025'000);
  EXPECT_EQ(p.recent(0).wait_us(), 3'000'000);
  EXPECT_EQ(p.recent(0).ended_us_ago(), 0);

  beacon.SetPhase(v1::RANK_PHASE_BETWEEN_STEPS, 8);
  now += absl::Seconds(1);
  p = beacon.Read();
  EXPECT_EQ(p.phase(), v1::RANK_PHASE_BETWEEN_STEPS);
  EXPECT_EQ(p.global_step(), 8);
  EXPECT_EQ(p.step_elapsed_us(), 0) << "between steps, no step clock";
  EXPECT_EQ(p.phase_elapsed_us(), 1'000'000);
}

TEST(ProgressBeacon, KeepsTheLatestActionsOldestFirst) {
  absl::Time now = absl::FromUnixSeconds(100);
  ProgressBeacon beacon("job-1", 0, 0, 0, [&] { return now; });
  beacon.BeginStep(0);
  const int n = ProgressBeacon::kRecentActions + 5;
  for (int i = 0; i < n; ++i) {
    beacon.BeginAction(absl::StrCat("0F", i));
    now += absl::Milliseconds(1);
    beacon.EndAction(absl::ZeroDuration());
  }
  const v1::RankProgress p = beacon.Read();
  ASSERT_EQ(p.recent_size(), ProgressBeacon::kRecentActions);
  EXPECT_EQ(p.recent(0).action(), "0F5");
  EXPECT_EQ(p.recent(p.recent_size() - 1).action(), absl::StrCat("0F", n - 1));
  EXPECT_EQ(p.recent(0).ended_us_ago(), (ProgressBeacon::kRecentActions - 1) * 1000);
}

}  // namespace
}  // namespace stagecoach::runtime
