// ReplicaHealth: the slices each healthy replica runs, and the settling of steps when replicas
// carry on without a lost one (coordinator/jobs/replica_health.h).
#include "coordinator/jobs/replica_health.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator {
namespace {

using ::testing::ElementsAre;
using Answer = ReplicaHealth::Answer;

TEST(AssignSlices, LostSlicesGoRoundRobinToTheHealthyReplicasInOrder) {
  EXPECT_THAT(AssignSlices(2, {}),
              ElementsAre(std::pair{0, std::vector<int>{0}}, std::pair{1, std::vector<int>{1}}));
  EXPECT_THAT(AssignSlices(2, {1}), ElementsAre(std::pair{0, std::vector<int>{0, 1}}));
  // Replica 0 lost: its slice goes to the lowest healthy replica, which runs it first.
  EXPECT_THAT(AssignSlices(3, {0}),
              ElementsAre(std::pair{1, std::vector<int>{0, 1}}, std::pair{2, std::vector<int>{2}}));
  EXPECT_THAT(AssignSlices(4, {1, 2}), ElementsAre(std::pair{0, std::vector<int>{0, 1}},
                                                   std::pair{3, std::vector<int>{2, 3}}));
  EXPECT_TRUE(AssignSlices(2, {0, 1}).empty());
}

ReplicaHealth::Arrival At(int replica, int rank, int epoch, int64_t step, bool failed = false) {
  ReplicaHealth::Arrival a;
  a.replica = replica;
  a.rank = rank;
  a.epoch = epoch;
  a.global_step = step;
  a.failed = failed;
  return a;
}

TEST(ReplicaHealth, AStepCommitsOnceEveryHealthyRankArrivedAndHandsOverItsLosses) {
  ReplicaHealth health;
  health.Reset(/*replicas=*/2, /*ranks=*/2, /*carry_on=*/true);
  EXPECT_EQ(health.Arrive(At(0, 0, 0, 5)), Answer::kPending);
  EXPECT_EQ(health.Arrive(At(0, 0, 0, 5)), Answer::kPending) << "asking again counts once";
  ReplicaHealth::Arrival last0 = At(0, 1, 0, 5);
  last0.losses = {1.0, 2.0};
  last0.slices = {0};
  EXPECT_EQ(health.Arrive(last0), Answer::kPending);
  EXPECT_EQ(health.Arrive(At(1, 0, 0, 5)), Answer::kPending);
  ReplicaHealth::Arrival last1 = At(1, 1, 0, 5);
  last1.losses = {3.0, 4.0};
  last1.slices = {1};
  std::map<int, std::vector<double>> losses;
  EXPECT_EQ(health.Arrive(last1, &losses), Answer::kCommit);
  EXPECT_THAT(losses, ElementsAre(std::pair{0, std::vector<double>{1.0, 2.0}},
                                  std::pair{1, std::vector<double>{3.0, 4.0}}));
  EXPECT_EQ(health.last_committed(), 5);
  EXPECT_EQ(health.AnswerFor(0, 5), Answer::kCommit);
  EXPECT_EQ(health.AnswerFor(0, 6), Answer::kPending);
}

TEST(ReplicaHealth, LosingAReplicaRetriesTheStepInFlightButNeverACommittedOne) {
  ReplicaHealth health;
  health.Reset(2, 1, true);
  ASSERT_EQ(health.Arrive(At(0, 0, 0, 0)), Answer::kPending);
  ASSERT_EQ(health.Arrive(At(1, 0, 0, 0)), Answer::kCommit);
  // Replica 0 arrived at step 1; replica 1 fails in the group.
  ASSERT_EQ(health.Arrive(At(0, 0, 0, 1)), Answer::kPending);
  ASSERT_EQ(health.Arrive(At(1, 0, 0, 1, /*failed=*/true)), Answer::kPending);
  ASSERT_TRUE(health.CanLose(1));
  health.Lose(1);
  EXPECT_EQ(health.epoch(), 1);
  EXPECT_EQ(health.healthy(), 1);
  EXPECT_TRUE(health.degraded());
  EXPECT_THAT(health.HealthyReplicas(), ElementsAre(0));
  EXPECT_THAT(health.SlicesOf(0), ElementsAre(0, 1));
  EXPECT_TRUE(health.SlicesOf(1).empty());
  EXPECT_EQ(health.AnswerFor(0, 1), Answer::kRetry) << "the step in flight runs again";
  EXPECT_EQ(health.AnswerFor(0, 0), Answer::kCommit) << "a committed step stays committed";
  // The last healthy replica cannot be lost: the job restarts instead.
  EXPECT_FALSE(health.CanLose(0));
  EXPECT_FALSE(health.CanLose(1)) << "already out";
  // An arrival of the lost replica does not count; the retried step commits on replica 0 alone.
  EXPECT_EQ(health.Arrive(At(1, 0, 1, 1)), Answer::kPending);
  EXPECT_EQ(health.Arrive(At(0, 0, 1, 1)), Answer::kCommit);
}

TEST(ReplicaHealth, AFailedArrivalWaitsForTheNewEpochAndAStaleOneIsToldToRetry) {
  ReplicaHealth health;
  health.Reset(3, 1, true);
  EXPECT_EQ(health.Arrive(At(0, 0, 0, 0, true)), Answer::kPending);
  EXPECT_EQ(health.Arrive(At(1, 0, 0, 0)), Answer::kPending);
  EXPECT_EQ(health.Arrive(At(2, 0, 0, 0)), Answer::kPending) << "a failed rank never commits";
  health.Lose(2);
  EXPECT_EQ(health.Arrive(At(1, 0, 0, 0)), Answer::kRetry) << "it ran with the old group";
  EXPECT_EQ(health.Arrive(At(0, 0, 1, 0)), Answer::kPending);
  EXPECT_EQ(health.Arrive(At(1, 0, 1, 0)), Answer::kCommit);
}

TEST(ReplicaHealth, AHealedReplicaRejoinsAtTheStepAfterTheNextCommitWithADonor) {
  ReplicaHealth health;
  health.Reset(2, 2, true);
  EXPECT_EQ(health.ReplicaToHeal(), -1) << "nothing lost";
  health.Lose(1);
  ASSERT_EQ(health.ReplicaToHeal(), 1);
  health.BeginHeal(1);
  EXPECT_EQ(health.healing(), 1);
  EXPECT_EQ(health.heals(), 1);
  EXPECT_EQ(health.ReplicaToHeal(), -1) << "one healing at a time";
  // Not every replacement is ready: step 3 commits without the rejoin.
  EXPECT_FALSE(health.JoinerReady(0));
  ASSERT_EQ(health.Arrive(At(0, 0, 1, 3)), Answer::kPending);
  ASSERT_EQ(health.Arrive(At(0, 1, 1, 3)), Answer::kCommit);
  EXPECT_TRUE(health.IsLost(1));
  EXPECT_TRUE(health.JoinerReady(1));
  // The job holds after step 5: no step would run with the healed replica, so it waits.
  ASSERT_EQ(health.Arrive(At(0, 0, 1, 4)), Answer::kPending);
  ASSERT_EQ(health.Arrive(At(0, 1, 1, 4), nullptr, /*rejoin_before=*/5), Answer::kCommit);
  EXPECT_TRUE(health.IsLost(1));
  // Step 5 commits: replica 1 is back from step 6, replica 0 its donor, a new epoch.
  ASSERT_EQ(health.Arrive(At(0, 0, 1, 5)), Answer::kPending);
  ASSERT_EQ(health.Arrive(At(0, 1, 1, 5)), Answer::kCommit);
  EXPECT_FALSE(health.IsLost(1));
  EXPECT_FALSE(health.degraded());
  EXPECT_EQ(health.epoch(), 2);
  EXPECT_EQ(health.join_step(), 6);
  EXPECT_EQ(health.donor(), 0);
  EXPECT_EQ(health.healing(), -1);
  EXPECT_THAT(health.SlicesOf(0), ElementsAre(0)) << "each replica its own slice again";
  EXPECT_THAT(health.SlicesOf(1), ElementsAre(1));
  EXPECT_EQ(health.AnswerFor(1, 5), Answer::kCommit) << "the late asker of step 5 commits too";
  // Step 6 needs all four ranks.
  ASSERT_EQ(health.Arrive(At(0, 0, 2, 6)), Answer::kPending);
  ASSERT_EQ(health.Arrive(At(0, 1, 2, 6)), Answer::kPending);
  ASSERT_EQ(health.Arrive(At(1, 0, 2, 6)), Answer::kPending);
  EXPECT_EQ(health.Arrive(At(1, 1, 2, 6)), Answer::kCommit);
}

TEST(ReplicaHealth, LosingTheHealingReplicaAgainAbandonsTheHealing) {
  ReplicaHealth health;
  health.Reset(3, 1, true);
  health.Lose(2);
  health.BeginHeal(2);
  health.Lose(0);  // another replica: the healing goes on
  EXPECT_EQ(health.healing(), 2);
  health.AbandonHeal();
  EXPECT_EQ(health.healing(), -1);
  EXPECT_EQ(health.ReplicaToHeal(), 0) << "the lowest lost replica next";
  health.BeginHeal(0);
  EXPECT_EQ(health.heals(), 2) << "each healing its own rendezvous";
}

}  // namespace
}  // namespace stagecoach::coordinator
