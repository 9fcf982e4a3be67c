// The stall rule and a job's diagnosis state (coordinator/diagnosis/stall_rule.h,
// job_diagnosis.h), on an injected clock: beacons carry how long ago, the coordinator adds how
// long since they arrived.
#include "coordinator/diagnosis/stall_rule.h"

#include <algorithm>
#include <deque>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "coordinator/diagnosis/job_diagnosis.h"
#include "coordinator/diagnosis/progress_inbox.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

v1::RankProgress InStep(int rank, int64_t step, absl::Duration elapsed) {
  v1::RankProgress p;
  p.set_job_id("job-1");
  p.set_rank(rank);
  p.set_global_step(step);
  p.set_phase(v1::RANK_PHASE_ACTIONS);
  p.set_step_elapsed_us(absl::ToInt64Microseconds(elapsed));
  p.set_phase_elapsed_us(absl::ToInt64Microseconds(elapsed));
  return p;
}

v1::RankProgress Waiting(int rank, int64_t step, absl::Duration elapsed, const char* kind,
                         int stage, int mb, int peer, absl::Duration waited) {
  v1::RankProgress p = InStep(rank, step, elapsed);
  p.set_action(absl::StrCat(stage, "F", mb));
  p.mutable_wait()->set_kind(kind);
  p.mutable_wait()->set_stage(stage);
  p.mutable_wait()->set_microbatch(mb);
  p.mutable_wait()->set_peer_rank(peer);
  p.mutable_wait()->set_tag(77);
  p.mutable_wait()->set_waited_us(absl::ToInt64Microseconds(waited));
  return p;
}

// A beacon kept for the rest of the test (a RankView does not own its beacon).
const v1::RankProgress* Keep(v1::RankProgress p) {
  static std::deque<v1::RankProgress> kept;
  kept.push_back(std::move(p));
  return &kept.back();
}

RankView View(int rank, std::optional<v1::RankProgress> p, absl::Time received) {
  RankView v;
  v.rank = rank;
  v.worker_id = absl::StrCat("w-", rank);
  v.address = absl::StrCat("host-", rank, ":4100", rank);
  v.progress = p.has_value() ? Keep(*std::move(p)) : nullptr;
  v.received = received;
  return v;
}

TEST(StallBound, FiveMedianStepsAtLeastThirtySecondsUnlessSetExplicitly) {
  StallOptions options;
  EXPECT_EQ(StallBound(options, {}), absl::Seconds(30)) << "no step completed yet";
  EXPECT_EQ(StallBound(options, {absl::Seconds(1), absl::Seconds(2), absl::Seconds(60)}),
            absl::Seconds(30))
      << "5 x the median (2 s) is below the floor";
  EXPECT_EQ(StallBound(options,
                       {absl::Seconds(10), absl::Seconds(8), absl::Seconds(12), absl::Seconds(9)}),
            absl::Seconds(47.5))
      << "5 x the median of an even count (9.5 s)";
  options.stall_after = absl::Seconds(3);
  EXPECT_EQ(StallBound(options, {absl::Seconds(100)}), absl::Seconds(3));
}

TEST(StallRule, AStepPastItsBoundNamesEachRanksActionPeerAndWait) {
  StallOptions options;
  options.silent_after = absl::Seconds(5);
  StallInputs in;
  in.step = 12;
  in.step_began = kT0;
  const absl::Time now = kT0 + absl::Seconds(45);
  // Rank 1 began the step 44 s ago (as of its beacon 1 s ago) and waits on rank 0's activation
  // for 40 s; rank 0 was frozen mid-forward: its last beacon is 38 s old.
  v1::RankProgress frozen = InStep(0, 12, absl::Seconds(2));
  frozen.set_action("0F5");
  frozen.set_action_elapsed_us(1'500'000);
  in.ranks.push_back(View(0, frozen, now - absl::Seconds(38)));
  in.ranks.push_back(View(1,
                          Waiting(1, 12, absl::Seconds(43), "RECV_F", 1, 5, 0, absl::Seconds(40)),
                          now - absl::Seconds(1)));

  EXPECT_EQ(EvaluateStall(in, absl::Seconds(50), options, now), std::nullopt)
      << "45 s is within a 50 s bound";
  std::optional<v1::JobStall> stall = EvaluateStall(in, absl::Seconds(30), options, now);
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->global_step(), 12);
  EXPECT_EQ(rpc::FromProtoDuration(stall->running()), absl::Seconds(44))
      << "from when rank 1 began it (the coordinator saw the previous step end a second before)";
  EXPECT_EQ(rpc::FromProtoTimestamp(stall->since()), kT0 + absl::Seconds(31));
  ASSERT_EQ(stall->ranks_size(), 2);
  EXPECT_EQ(stall->ranks(0).summary(),
            "silent for 38.0 s (no heartbeat); last heard: in F stage 0 microbatch 5 of step 12 "
            "for 1.5 s");
  EXPECT_EQ(stall->ranks(1).summary(),
            "RECV_F stage 1 microbatch 5 from rank 0 (host-0:41000) (tag 77), waiting 41.0 s");
  EXPECT_EQ(stall->ranks(1).worker_id(), "w-1");
  EXPECT_EQ(rpc::FromProtoDuration(stall->ranks(1).beacon_age()), absl::Seconds(1));
}

TEST(StallRule, TheStepClockStartsWhenTheFirstRankBeganNotBefore) {
  StallOptions options;
  StallInputs in;
  in.step = 3;
  in.step_began = kT0;  // the previous step completed long ago: a slow data loader, say
  const absl::Time now = kT0 + absl::Seconds(100);
  in.ranks.push_back(View(0, InStep(0, 3, absl::Seconds(10)), now - absl::Seconds(1)));
  ASSERT_EQ(StepRunning(in, options, now), absl::Seconds(11));
  // A rank still setting up: not stalled, whatever the clock says.
  v1::RankProgress setup;
  setup.set_phase(v1::RANK_PHASE_SETUP);
  in.ranks.push_back(View(1, setup, now));
  EXPECT_EQ(StepRunning(in, options, now), std::nullopt);
  // No rank has begun the step: nothing runs, so nothing stalls.
  in.ranks.clear();
  v1::RankProgress between;
  between.set_phase(v1::RANK_PHASE_BETWEEN_STEPS);
  between.set_global_step(3);
  in.ranks.push_back(View(0, between, now));
  EXPECT_EQ(StepRunning(in, options, now), std::nullopt);
  // A beacon of the previous step does not start this one.
  in.ranks.push_back(View(1, InStep(1, 2, absl::Seconds(50)), now));
  EXPECT_EQ(StepRunning(in, options, now), std::nullopt);
  // A rank already in the next step (its peer froze before reporting this one) does.
  in.ranks.push_back(View(2, InStep(2, 4, absl::Seconds(20)), now - absl::Seconds(1)));
  EXPECT_EQ(StepRunning(in, options, now), absl::Seconds(21));
}

TEST(StallRule, ASilentRanksSettingUpBeaconDoesNotHoldTheStallOff) {
  // Rank 0 froze right after its setup, before a heartbeat carried a beacon of its steps: its
  // latest beacon says it sets up, while rank 1 has waited on it for 40 s.
  StallOptions options;
  options.silent_after = absl::Seconds(2);
  StallInputs in;
  in.step = 5;
  const absl::Time now = kT0 + absl::Seconds(100);
  in.step_began = now - absl::Seconds(41);
  v1::RankProgress setup;
  setup.set_phase(v1::RANK_PHASE_SETUP);
  in.ranks.push_back(View(0, setup, now - absl::Seconds(2)));
  in.ranks.push_back(View(1, InStep(1, 5, absl::Seconds(39)), now - absl::Seconds(1)));
  EXPECT_EQ(StepRunning(in, options, now), std::nullopt)
      << "heard from within silent_after: it is still setting up";
  in.ranks[0].received = now - absl::Seconds(3);
  EXPECT_EQ(StepRunning(in, options, now), absl::Seconds(40));
  // A heartbeat without a beacon keeps it heard from.
  in.ranks[0].last_heartbeat = now - absl::Seconds(1);
  EXPECT_EQ(StepRunning(in, options, now), std::nullopt);
  in.ranks[0].last_heartbeat = now - absl::Seconds(10);
  const std::optional<v1::JobStall> stall = EvaluateStall(in, absl::Seconds(4), options, now);
  ASSERT_TRUE(stall.has_value());
  EXPECT_THAT(stall->ranks(0).summary(), HasSubstr("silent for 3.0 s"));
}

TEST(StallRule, SummariesSayWhatEachPhaseWaitsFor) {
  StallOptions options;
  const absl::Time now = kT0;
  std::vector<RankView> all = {View(0, std::nullopt, now), View(1, std::nullopt, now)};
  EXPECT_EQ(SummarizeRank(all[0], all, options, now), "no progress beacon yet");

  v1::RankProgress send = InStep(0, 7, absl::Seconds(9));
  send.set_phase(v1::RANK_PHASE_SENDS);
  send.add_recent()->set_action("0F5");
  send.mutable_wait()->set_kind("SEND");
  send.mutable_wait()->set_peer_rank(1);
  send.mutable_wait()->set_tag(9);
  send.mutable_wait()->set_waited_us(4'000'000);
  EXPECT_EQ(SummarizeRank(View(0, send, now - absl::Seconds(1)), all, options, now),
            "finished F stage 0 microbatch 5, waiting on the send to rank 1 (host-1:41001) (tag "
            "9) for 5.0 s");

  v1::RankProgress reduce = InStep(0, 7, absl::Seconds(9));
  reduce.set_phase(v1::RANK_PHASE_REDUCTION);
  reduce.set_phase_elapsed_us(2'000'000);
  EXPECT_EQ(SummarizeRank(View(0, reduce, now), all, options, now),
            "reducing step 7's gradients with its replicas for 2.0 s");

  // With sharded parameters (2 replicas of 2 ranks): rank 0 of replica 0 waits in a forward
  // for its stage's all-gather, which needs rank 0 of replica 1.
  v1::RankProgress gather = InStep(0, 7, absl::Seconds(9));
  gather.set_action("0F2");
  gather.mutable_wait()->set_kind("ALL_GATHER");
  gather.mutable_wait()->set_stage(0);
  gather.mutable_wait()->set_microbatch(-1);
  gather.mutable_wait()->set_peer_rank(-1);
  gather.mutable_wait()->set_waited_us(3'000'000);
  std::vector<RankView> replicated = all;
  for (int rank = 0; rank < 2; ++rank) {
    RankView other = View(rank, std::nullopt, now);
    other.replica = 1;
    other.address = absl::StrCat("host-", rank + 2, ":4100", rank + 2);
    replicated.push_back(other);
  }
  EXPECT_EQ(SummarizeRank(View(0, gather, now - absl::Seconds(1)), replicated, options, now),
            "in F stage 0 microbatch 2, waiting for the all-gather of stage 0's parameters with "
            "replica 1 (host-2:41002) for 4.0 s");
  EXPECT_EQ(SummarizeRank(View(0, gather, now), all, options, now),
            "in F stage 0 microbatch 2, waiting for the all-gather of stage 0's parameters with "
            "its replicas for 3.0 s");

  v1::RankProgress recipe = InStep(0, 7, absl::Seconds(9));
  recipe.set_phase(v1::RANK_PHASE_OPTIMIZER);
  recipe.mutable_wait()->set_kind("JOB_REDUCTION receive");
  recipe.mutable_wait()->set_peer_rank(1);
  recipe.mutable_wait()->set_tag(5);
  recipe.mutable_wait()->set_waited_us(2'500'000);
  EXPECT_EQ(SummarizeRank(View(0, recipe, now), all, options, now),
            "in step 7's optimizer step, its job reduction receiving from rank 1 (host-1:41001) "
            "(tag 5), waiting 2.5 s");

  v1::RankProgress between;
  between.set_phase(v1::RANK_PHASE_BETWEEN_STEPS);
  between.set_global_step(8);
  between.set_phase_elapsed_us(30'000'000);
  EXPECT_EQ(SummarizeRank(View(0, between, now), all, options, now),
            "finished step 7, waiting to begin step 8 for 30.0 s");
}

TEST(StallRule, ARankFrozenBeforeItsFirstBeaconIsSilentByItsHeartbeats) {
  StallOptions options;
  options.silent_after = absl::Seconds(5);
  const absl::Time now = kT0;
  std::vector<RankView> all = {View(0, std::nullopt, absl::InfinitePast()),
                               View(1, std::nullopt, absl::InfinitePast())};
  all[0].last_heartbeat = now - absl::Seconds(9);
  all[1].last_heartbeat = now - absl::Seconds(1);
  EXPECT_EQ(SummarizeRank(all[0], all, options, now),
            "silent for 9.0 s (no heartbeat); no progress beacon from it in this attempt");
  EXPECT_EQ(SummarizeRank(all[1], all, options, now), "no progress beacon yet");
  // A beacon older than the latest heartbeat: heard from, not silent.
  all[1].progress = Keep(InStep(1, 3, absl::Seconds(1)));
  all[1].received = now - absl::Seconds(20);
  EXPECT_THAT(SummarizeRank(all[1], all, options, now), ::testing::StartsWith("between actions"));
}

TEST(DescribeAction, StageKindMicrobatch) {
  EXPECT_EQ(DescribeAction("2F5"), "F stage 2 microbatch 5");
  EXPECT_EQ(DescribeAction("10RECV_B3"), "RECV_B stage 10 microbatch 3");
  EXPECT_EQ(DescribeAction("0REDUCE_GRAD"), "0REDUCE_GRAD");
  EXPECT_EQ(DescribeAction(""), "");
}

TEST(JobDiagnosis, StepDurationsCountOnlyWhileRunningAndStallEventsMarkBothEnds) {
  JobDiagnosis d;
  d.StartAttempt(1, {"a", "a"}, 2, StragglerOptions());
  d.SetRunning(true, kT0);
  d.StepCompleted(kT0 + absl::Seconds(2));
  d.StepCompleted(kT0 + absl::Seconds(5));
  ASSERT_THAT(d.recent_steps(), ::testing::ElementsAre(absl::Seconds(2), absl::Seconds(3)));
  d.SetRunning(false, kT0 + absl::Seconds(6));  // paused mid-step
  d.StepCompleted(kT0 + absl::Seconds(100));
  EXPECT_EQ(d.recent_steps().size(), 2u) << "a step that spanned a pause is not a duration";
  d.SetRunning(true, kT0 + absl::Seconds(200));
  EXPECT_EQ(d.step_began(), kT0 + absl::Seconds(200));

  // Beacons of another attempt are not this one's.
  v1::RankProgress stale = InStep(0, 1, absl::Seconds(1));
  stale.set_attempt(0);
  d.Record(0, stale, kT0);
  EXPECT_FALSE(d.progress(0).has_value());
  stale.set_attempt(1);
  d.Record(0, stale, kT0);
  EXPECT_TRUE(d.progress(0).has_value());

  v1::JobStall stall;
  stall.set_global_step(4);
  *stall.mutable_bound() = rpc::ToProtoDuration(absl::Seconds(30));
  *stall.mutable_since() = rpc::ToProtoTimestamp(kT0 + absl::Seconds(230));
  std::optional<v1::JobEvent> began = d.SetStall(stall, kT0 + absl::Seconds(231));
  ASSERT_TRUE(began.has_value() && began->has_stalled());
  EXPECT_FALSE(d.SetStall(stall, kT0 + absl::Seconds(232)).has_value()) << "still stalled";
  std::optional<v1::JobEvent> ended = d.SetStall(std::nullopt, kT0 + absl::Seconds(240));
  ASSERT_TRUE(ended.has_value() && ended->has_stall_ended());
  EXPECT_EQ(rpc::FromProtoDuration(ended->stall_ended().stall().running()), absl::Seconds(40));
}

// Heartbeats leave beacons in the inbox; the tick takes the latest of each worker and job once.
TEST(ProgressInbox, KeepsTheLatestBeaconOfEachWorkerAndJobUntilTaken) {
  ProgressInbox inbox;
  v1::RankProgress a;
  a.set_job_id("job-1");
  a.set_rank(0);
  a.set_global_step(3);
  inbox.Post("w-1", a, kT0);
  a.set_global_step(5);
  inbox.Post("w-1", a, kT0 + absl::Seconds(1));
  v1::RankProgress b = a;
  b.set_job_id("job-2");
  inbox.Post("w-1", b, kT0 + absl::Seconds(2));
  inbox.Post("w-2", a, kT0 + absl::Seconds(3));
  std::vector<ProgressInbox::Posted> taken = inbox.Take();
  ASSERT_EQ(taken.size(), 3u);
  std::sort(taken.begin(), taken.end(), [](const auto& x, const auto& y) {
    return std::tie(x.worker_id, x.progress.job_id()) < std::tie(y.worker_id, y.progress.job_id());
  });
  EXPECT_EQ(taken[0].worker_id, "w-1");
  EXPECT_EQ(taken[0].progress.job_id(), "job-1");
  EXPECT_EQ(taken[0].progress.global_step(), 5) << "the latest";
  EXPECT_EQ(taken[0].received, kT0 + absl::Seconds(1));
  EXPECT_EQ(taken[1].progress.job_id(), "job-2");
  EXPECT_EQ(taken[2].worker_id, "w-2");
  EXPECT_TRUE(inbox.Take().empty()) << "taken once";
}

}  // namespace
}  // namespace stagecoach::coordinator
