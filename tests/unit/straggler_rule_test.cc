// The straggler rule (coordinator/diagnosis/straggler_rule.h): a rank's compute against the
// median of its peers with the same work, over a window of steps, with hysteresis.
#include "coordinator/diagnosis/straggler_rule.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator {
namespace {

using ::testing::ElementsAre;

v1::ActionTiming Timing(int64_t start, int64_t end, int64_t wait = 0) {
  v1::ActionTiming t;
  t.set_start_us(start);
  t.set_end_us(end);
  t.set_wait_us(wait);
  return t;
}

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);
// Step n completes at kStart + n x 100 ms.
absl::Time At(int64_t step) { return kStart + step * absl::Milliseconds(100); }

StragglerOptions NoTimeWindow() {
  StragglerOptions options;
  options.min_window = absl::ZeroDuration();
  return options;
}

ComputeSample Sample(double f, double b) {
  ComputeSample s;
  s.total = f + b;
  s.by_kind["F"] = {f, 1};
  s.by_kind["B"] = {b, 1};
  return s;
}

TEST(SampleStep, OwnTimeOfComputeActionsByKindWaitsAndTransfersLeftOut) {
  const ComputeSample s =
      SampleStep({"0RECV_F0", "0F0", "0F1", "0SEND_F0", "0B0", "0W0", "nonsense"},
                 {Timing(0, 5), Timing(5, 1005, 400), Timing(1005, 1505), Timing(1505, 1510),
                  Timing(2000, 4000), Timing(4000, 4300), Timing(4300, 4400)});
  EXPECT_DOUBLE_EQ(s.total, (600 + 500 + 2000 + 300) * 1e-6);
  EXPECT_DOUBLE_EQ(s.by_kind.at("F").first, 1100e-6);
  EXPECT_EQ(s.by_kind.at("F").second, 2);
  EXPECT_EQ(s.by_kind.count("SEND_F"), 0u);
  EXPECT_EQ(SampleStep({"0F0"}, {}).total, 0.0) << "timings missing: no sample";
}

// Two replicas of a 2-rank pipeline: tasks 0,1 (replica 0) and 2,3 (replica 1); rank 0's tasks
// are peers, and so are rank 1's.
StragglerWatch TwoReplicas(StragglerOptions options = {}) {
  return StragglerWatch(options, {"first", "last", "first", "last"}, /*num_ranks=*/2);
}

TEST(StragglerWatch, ARankPersistentlySlowerThanItsPeersIsNamedOnceTheWindowIsFull) {
  StragglerOptions options = NoTimeWindow();
  options.window = 4;
  StragglerWatch watch = TwoReplicas(options);
  std::vector<v1::StragglerEvent> events;
  for (int step = 0; step < 4; ++step) {
    watch.Add(step, 0, Sample(1.0, 2.0));
    watch.Add(step, 1, Sample(1.0, 2.0));
    watch.Add(step, 2, Sample(1.6, 3.2));  // replica 1 rank 0: 1.6x
    watch.Add(step, 3, Sample(1.0, 2.0));
    events = watch.Complete(step, At(step));
    if (step < 3) {
      EXPECT_TRUE(events.empty()) << "step " << step << ": the window is not full";
    }
  }
  // With two peers each is the other's median: the slow one is 1.6x, the other 1/1.6 (on pace).
  ASSERT_EQ(events.size(), 1u);
  const v1::RankStraggler& s = events[0].straggler();
  EXPECT_TRUE(events[0].straggling());
  EXPECT_EQ(s.replica(), 1);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_DOUBLE_EQ(s.ratio(), 1.6);
  EXPECT_DOUBLE_EQ(s.kind_ratios().at("B"), 1.6);
  EXPECT_THAT(s.peer_tasks(), ElementsAre(0));
  EXPECT_EQ(s.window_steps(), 4);
  EXPECT_EQ(watch.Stragglers().size(), 1u);
  EXPECT_EQ(watch.Pace().size(), 4u);
}

TEST(StragglerWatch, OneSlowStepInTheWindowNamesNobody) {
  StragglerOptions options = NoTimeWindow();
  options.window = 8;
  StragglerWatch watch = TwoReplicas(options);
  for (int step = 0; step < 8; ++step) {
    const double slow = step == 3 ? 5.0 : 1.05;  // a checkpoint write, say
    watch.Add(step, 0, Sample(1.0, 1.0));
    watch.Add(step, 2, Sample(slow, slow));
    EXPECT_TRUE(watch.Complete(step, At(step)).empty());
  }
  ASSERT_EQ(watch.Pace().size(), 4u);
  EXPECT_EQ(watch.Pace()[2].replica(), 1);
  EXPECT_NEAR(watch.Pace()[2].ratio(), 1.05, 1e-9) << "the median over the window";
}

TEST(StragglerWatch, StragglingEndsOnlyBelowHalfwayToTheThreshold) {
  StragglerOptions options = NoTimeWindow();
  options.window = 1;
  options.threshold = 1.5;
  StragglerWatch watch = TwoReplicas(options);
  auto step = [&](int n, double ratio) {
    watch.Add(n, 0, Sample(1.0, 1.0));
    watch.Add(n, 2, Sample(ratio, ratio));
    return watch.Complete(n, At(n));
  };
  EXPECT_TRUE(step(0, 1.4).empty());
  ASSERT_EQ(step(1, 1.5).size(), 1u);
  EXPECT_TRUE(step(2, 1.3).empty()) << "1.3 >= 1.25: still straggling";
  const std::vector<v1::StragglerEvent> back = step(3, 1.2);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_FALSE(back[0].straggling());
  EXPECT_TRUE(watch.Stragglers().empty());
}

TEST(StragglerWatch, RanksWithoutPeersAreNeverJudgedAndMissingReportsAreSkipped) {
  StragglerOptions options = NoTimeWindow();
  options.window = 2;
  StragglerWatch watch(options, {"first", "middle", "last"}, 3);
  for (int step = 0; step < 3; ++step) {
    watch.Add(step, 0, Sample(1.0, 1.0));
    watch.Add(step, 1, Sample(9.0, 9.0));
    EXPECT_TRUE(watch.Complete(step, At(step)).empty());
  }
  EXPECT_TRUE(watch.Pace().empty());
  // A lost replica's task reports nothing: its peer has no ratio that step.
  StragglerWatch replicas = TwoReplicas(options);
  for (int step = 0; step < 3; ++step) {
    replicas.Add(step, 0, Sample(1.0, 1.0));
    replicas.Add(step, 2, Sample(3.0, 3.0));
    replicas.Complete(step, At(step));
  }
  replicas.Add(3, 0, Sample(1.0, 1.0));
  EXPECT_TRUE(replicas.Complete(3, At(3)).empty());
  EXPECT_EQ(replicas.Stragglers().size(), 1u) << "named before; one missing step changes nothing";
  EXPECT_TRUE(replicas.Complete(99, At(99)).empty()) << "a step nobody reported";
}

TEST(StragglerWatch, TheWindowSpansMinWindowOfTimeSoThatAStretchOfFastStepsIsNotAllItSees) {
  StragglerOptions options;  // 8 steps, and at least 30 s
  options.min_window = absl::Seconds(2);
  StragglerWatch watch = TwoReplicas(options);
  std::vector<v1::StragglerEvent> events;
  // 30 steps of 100 ms: the slow replica is 2x in the first 12 only (a stretch of
  // time-sharing), on pace after.
  int64_t named_at = -1;
  for (int step = 0; step < 30; ++step) {
    watch.Add(step, 0, Sample(1.0, 1.0));
    const double r = step < 12 ? 2.0 : 1.0;
    watch.Add(step, 2, Sample(r, r));
    events = watch.Complete(step, At(step));
    if (!events.empty() && events[0].straggling() && named_at < 0) named_at = step;
  }
  EXPECT_EQ(named_at, 20) << "not before 2 s of steps, though 8 steps were slow long before";
  // At step 29 the window is steps 9..29 (2 s): 3 slow of 21, so the pace is back to 1.
  ASSERT_EQ(watch.Pace().size(), 4u);
  EXPECT_DOUBLE_EQ(watch.Pace()[2].ratio(), 1.0);
  EXPECT_TRUE(watch.Stragglers().empty());
}

}  // namespace
}  // namespace stagecoach::coordinator
