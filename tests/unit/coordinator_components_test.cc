// The coordinator's components alone, with fakes and no JobManager: placement (gang, FIFO,
// reasons, restarts), task assignment, step aggregation, failure investigation, the restart
// policy, the job lifecycle's start and end, checkpoint collection, recovery and admission.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "common/util/executor.h"
#include "common/util/sha256.h"
#include "coordinator/checkpoints/checkpoint_collection.h"
#include "coordinator/control/step_aggregation.h"
#include "coordinator/lifecycle/admission.h"
#include "coordinator/lifecycle/failure_investigation.h"
#include "coordinator/lifecycle/job_lifecycle.h"
#include "coordinator/lifecycle/placement.h"
#include "coordinator/lifecycle/recovery.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::coordinator_components_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

std::string Spec(int stages, const std::string& extra = "") {
  return absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n",
                      "split: {stages: ", stages, "}\nschedule: {kind: GPipe, microbatches: 4}\n",
                      "training: {batch_size: 8, steps: 3", extra, "}\n");
}

Job& QueueJob(JobTable& table, const std::string& spec_yaml) {
  return QueuePlannedJob(table, spec_yaml, kT0);
}

std::string Register(WorkerRegistry& registry, int n) {
  auto id =
      registry.Register(absl::StrCat("w", n), absl::StrCat("10.0.0.", n, ":7000"), "cpu", {}, kT0);
  EXPECT_TRUE(id.ok());
  return *id;
}

// --- Placement and task assignment ---

TEST(Placement, GangsInFifoOrderAndSaysWhyAJobWaits) {
  WorkerRegistry registry(absl::Seconds(10));
  JobTable table({}, nullptr);
  Placement placement(TaskSettings{absl::Seconds(7), absl::Hours(3)}, &registry);
  Register(registry, 1);
  Register(registry, 2);
  absl::MutexLock lock(&table.mu());
  Job& big = QueueJob(table, Spec(3));
  Job& small = QueueJob(table, Spec(2));
  EXPECT_TRUE(placement.PlaceLocked(table, kT0).empty());
  EXPECT_EQ(big.reason, "waiting for 3 workers, 2 free");
  EXPECT_EQ(small.reason, "queued behind job-1; needs 2 cpu workers") << "strict FIFO";
  const std::string w3 = Register(registry, 3);
  std::vector<StartOrder> orders = placement.PlaceLocked(table, kT0);
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].job_id, big.id);
  EXPECT_EQ(orders[0].attempt, 1);
  ASSERT_EQ(orders[0].tasks.size(), 3u);
  EXPECT_EQ(big.state, v1::JOB_STATE_STARTING);
  EXPECT_TRUE(big.starting);
  EXPECT_THAT(big.reason, HasSubstr("starting attempt 1 on w-1, w-2, w-3"));
  EXPECT_EQ(registry.Find(w3)->state, v1::WORKER_STATE_BUSY);
  EXPECT_EQ(registry.Find(w3)->rank, 2);
  EXPECT_EQ(small.reason, "waiting for 2 workers, 0 free");
  const v1::TaskAssignment& task = orders[0].tasks[2].second;
  EXPECT_EQ(orders[0].tasks[2].first, "10.0.0.3:7000");
  EXPECT_EQ(task.rank(), 2);
  EXPECT_EQ(task.world_size(), 3);
  EXPECT_EQ(task.step_limit(), 3);
  EXPECT_EQ(task.comm_timeout().seconds(), 7);
  EXPECT_EQ(task.hold_timeout().seconds(), 3 * 3600);
  EXPECT_EQ(task.rendezvous_prefix(), "jobs/job-1/attempt-1/");
  EXPECT_EQ(task.stages(0).stage(), 2);
  EXPECT_FALSE(task.has_resume());
  EXPECT_EQ(task.actions(0), "2RECV_F0");
  EXPECT_TRUE(orders[0].set_aside_dir.empty()) << "a first attempt sets nothing aside";
  EXPECT_EQ(task.ranks_on_host(), 1) << "10.0.0.1, 10.0.0.2 and 10.0.0.3 are three hosts";
}

TEST(Placement, EachRankAtAHostGetsItsPlaceAmongThem) {
  WorkerRegistry registry(absl::Seconds(10));
  JobTable table({}, nullptr);
  Placement placement(TaskSettings{}, &registry);
  // Three workers at 127.0.0.1 and one at 10.0.0.4.
  for (int n = 1; n <= 3; ++n) {
    ASSERT_TRUE(
        registry.Register(absl::StrCat("w", n), absl::StrCat("127.0.0.1:700", n), "cpu", {}, kT0)
            .ok());
  }
  Register(registry, 4);
  absl::MutexLock lock(&table.mu());
  QueueJob(table, Spec(4));
  std::vector<StartOrder> orders = placement.PlaceLocked(table, kT0);
  ASSERT_EQ(orders.size(), 1u);
  ASSERT_EQ(orders[0].tasks.size(), 4u);
  std::map<std::string, std::vector<int>> places;  // host -> index_on_host by rank
  for (const auto& [address, task] : orders[0].tasks) {
    const std::string host = address.substr(0, address.find(':'));
    EXPECT_EQ(task.ranks_on_host(), host == "127.0.0.1" ? 3 : 1) << address;
    places[host].push_back(task.index_on_host());
  }
  EXPECT_THAT(places["127.0.0.1"], ElementsAre(0, 1, 2));
  EXPECT_THAT(places["10.0.0.4"], ElementsAre(0));
}

TEST(Placement, RanksOnHostCountsTheJobsRanksAtTheSameHost) {
  std::vector<RankSlot> ranks(5);
  ranks[0].worker_address = "127.0.0.1:7001";
  ranks[1].worker_address = "127.0.0.1:7002";
  ranks[2].worker_address = "10.0.0.2:7000";
  ranks[3].worker_address = "[::1]:7000";
  ranks[4].worker_address = "127.0.0.1:7003";
  EXPECT_EQ(RanksOnHost(ranks, "127.0.0.1:7002"), 3);
  EXPECT_EQ(RanksOnHost(ranks, "10.0.0.2:7000"), 1);
  EXPECT_EQ(RanksOnHost(ranks, "[::1]:9"), 1);
  EXPECT_EQ(RanksOnHost(ranks, "10.0.0.9:7000"), 0);
}

TEST(Placement, ARestartWaitsForItsWorkersAndManifestsThenResumesFromTheLatestCheckpoint) {
  WorkerRegistry registry(absl::Seconds(10));
  JobTable table({}, nullptr);
  Placement placement(TaskSettings{}, &registry);
  const std::string w1 = Register(registry, 1), w2 = Register(registry, 2);
  absl::MutexLock lock(&table.mu());
  Job& job = QueueJob(table, Spec(2, ", checkpoint: {dir: /ckpt}"));
  ASSERT_EQ(placement.PlaceLocked(table, kT0).size(), 1u);
  job.starting = false;
  ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_RUNNING, "running", kT0).ok());
  job.losses = {3.0, 2.0, 1.0};
  v1::JobCheckpoint& c = job.checkpoints.emplace_back();
  c.set_step(2);
  c.set_directory("/ckpt/step-000002");
  for (int s = 0; s < 2; ++s) {
    v1::StageCheckpointFile f;
    f.set_stage(s);
    f.set_file(absl::StrCat("stage-", s, ".pt"));
    job.checkpoint_stage_files[2].push_back({f});
  }
  ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_RESTARTING, "w-2 lost", kT0).ok());
  EXPECT_TRUE(placement.PlaceLocked(table, kT0).empty()) << "its workers still hold it";
  registry.Release(w1, job.id);
  registry.Release(w2, job.id);
  job.manifests_in_flight = 1;
  EXPECT_TRUE(placement.PlaceLocked(table, kT0).empty()) << "a checkpoint is being completed";
  job.manifests_in_flight = 0;
  std::vector<StartOrder> orders = placement.PlaceLocked(table, kT0);
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(job.attempt, 2);
  EXPECT_EQ(job.attempt_base, 2);
  EXPECT_THAT(job.losses, ElementsAre(3.0, 2.0)) << "step 3 runs again";
  ASSERT_TRUE(job.restored.has_value());
  EXPECT_EQ(orders[0].set_aside_dir, "/ckpt");
  EXPECT_EQ(orders[0].set_aside_after, 2);
  EXPECT_EQ(orders[0].set_aside_tag, "attempt-1");
  const v1::TaskAssignment& rank1 = orders[0].tasks[1].second;
  EXPECT_EQ(rank1.attempt(), 2);
  EXPECT_EQ(rank1.resume().step(), 2);
  ASSERT_EQ(rank1.resume().files_size(), 1);
  EXPECT_EQ(rank1.resume().files(0).file(), "stage-1.pt");
  EXPECT_THAT(rank1.checkpoint_steps(), ElementsAre(3)) << "the final checkpoint";
}

// --- Step aggregation ---

class StepAggregationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::MutexLock lock(&table_.mu());
    job_ = &QueueJob(table_, Spec(2));
    for (int r = 0; r < 2; ++r) job_->ranks.emplace_back().rank = r;
  }
  v1::ReportStepRequest Report(int rank, int step, std::vector<double> losses, double bubble) {
    v1::ReportStepRequest r;
    r.set_rank(rank);
    r.set_step(step);
    for (double l : losses) r.add_microbatch_losses(l);
    r.set_bubble_ratio(bubble);
    r.set_bytes_sent(10);
    r.add_executed_actions("0F0");
    r.add_action_timings()->set_end_us(3);
    r.mutable_step_time()->set_seconds(2);
    return r;
  }
  JobTable table_{{}, nullptr};
  Job* job_ = nullptr;
  StepAggregator aggregator_{nullptr};
};

TEST_F(StepAggregationTest, AStepCompletesWhenEveryRankReported) {
  absl::MutexLock lock(&table_.mu());
  Job& job = *job_;
  job.client_step = Job::ClientStepState{};
  const auto last = Report(1, 0, {1, 2, 3, 6}, 0.5);
  ASSERT_TRUE(aggregator_.CheckLocked(job, job.ranks[1], last).ok());
  EXPECT_FALSE(aggregator_.AddLocked(job, job.ranks[1], last, kT0));
  EXPECT_TRUE(job.losses.empty());
  const auto first = Report(0, 0, {}, 0.25);
  EXPECT_TRUE(aggregator_.AddLocked(job, job.ranks[0], first, kT0));
  EXPECT_THAT(job.losses, ElementsAre(3.0));
  EXPECT_THAT(job.max_bubble_ratios, ElementsAre(0.5));
  EXPECT_EQ(job.steps_completed, 1);
  EXPECT_EQ(job.ranks[0].bytes_sent, 10);
  EXPECT_TRUE(job.partial_steps.empty());
  ASSERT_TRUE(job.client_step->done) << "a client step at global step 0 gets its losses";
  EXPECT_THAT(job.client_step->losses, ElementsAre(1, 2, 3, 6));
  const EventLog::Slice events = job.events.Since(0);
  const v1::StepCompleted& step = events.events.back().step_completed();
  EXPECT_EQ(step.loss(), 3.0);
  EXPECT_EQ(step.steps_total(), 3);
  EXPECT_EQ(step.samples_per_second(), 4.0);
  EXPECT_THAT(step.bubble_ratios(), ElementsAre(0.25, 0.5));
  EXPECT_EQ(job.traces.last_kept(), 0);
}

TEST(StepAggregation, ReplicasLossesJoinInReplicaOrderAndDivergedReplicasAreNamed) {
  JobTable table{{}, nullptr};
  StepAggregator aggregator{nullptr};
  absl::MutexLock lock(&table.mu());
  // 2 ranks x 2 replicas; the global batch of 8 rows in 2 x 4 microbatches.
  Job& job = QueueJob(table, absl::StrCat(Spec(2), "placement: {replicas: 2}\n"));
  ASSERT_EQ(job.plan.replicas, 2);
  ASSERT_EQ(job.plan.num_tasks(), 4);
  for (int replica = 0; replica < 2; ++replica) {
    for (int r = 0; r < 2; ++r) {
      RankSlot& slot = job.ranks.emplace_back();
      slot.rank = r;
      slot.replica = replica;
    }
  }
  auto report = [](int rank, int replica, std::vector<double> losses, double bubble,
                   const std::string& digest) {
    v1::ReportStepRequest r;
    r.set_rank(rank);
    r.set_replica(replica);
    r.set_step(0);
    for (double l : losses) r.add_microbatch_losses(l);
    r.set_bubble_ratio(bubble);
    r.mutable_reduction()->set_hidden_ratio(0.25 * (replica + 1));
    (*r.mutable_parameter_digests())[rank] = digest;
    return r;
  };
  // Out of order: replica 1's last stage first.
  EXPECT_FALSE(aggregator.AddLocked(job, job.ranks[3], report(1, 1, {5, 6, 7, 8}, 0.4, "b"), kT0));
  EXPECT_FALSE(aggregator.AddLocked(job, job.ranks[0], report(0, 0, {}, 0.1, "a"), kT0));
  EXPECT_FALSE(aggregator.AddLocked(job, job.ranks[1], report(1, 0, {1, 2, 3, 4}, 0.2, "b"), kT0));
  EXPECT_TRUE(job.step_failure.empty());
  // Replica 1 of stage 0 holds other parameters than replica 0.
  EXPECT_TRUE(aggregator.AddLocked(job, job.ranks[2], report(0, 1, {}, 0.3, "z"), kT0));
  EXPECT_THAT(job.losses, ElementsAre(4.5));  // the mean of all 8 microbatches
  const v1::StepCompleted step = job.events.Since(0).events.back().step_completed();
  EXPECT_THAT(step.bubble_ratios(), ElementsAre(0.1, 0.2, 0.3, 0.4));
  EXPECT_THAT(step.reduction_hidden_ratios(), ElementsAre(0.25, 0.25, 0.5, 0.5));
  EXPECT_THAT(job.step_failure, HasSubstr("replicas 0 and 1 of stage 0 hold different parameters"));
}

TEST(StepAggregation, TheRecipesSkipsEvalLossesAndARunOfSkippedStepsAreRecorded) {
  JobTable table{{}, nullptr};
  StepAggregator aggregator{nullptr};
  absl::MutexLock lock(&table.mu());
  // 2 ranks x 2 replicas, eval of 2 batches after every second step, at most 2 skips in a row.
  Job& job = QueueJob(table, absl::StrCat(Spec(2, ", max_skipped_steps: 2"),
                                          "placement: {replicas: 2}\n"
                                          "eval: {every_steps: 2, batches: 2, data: {seed: 1}}\n"));
  for (int replica = 0; replica < 2; ++replica) {
    for (int r = 0; r < 2; ++r) {
      RankSlot& slot = job.ranks.emplace_back();
      slot.rank = r;
      slot.replica = replica;
    }
  }
  // Every rank reports the same decisions; the last stage's ranks their losses and eval losses.
  auto step = [&](int index, bool skipped, std::vector<double> eval) {
    bool completed = false;
    for (RankSlot& slot : job.ranks) {
      v1::ReportStepRequest r;
      r.set_rank(slot.rank);
      r.set_replica(slot.replica);
      r.set_step(index);
      r.set_learning_rate(0.1 / (index + 1));
      if (!skipped) r.set_grad_norm(2.0 + index);
      r.set_skipped(skipped);
      if (skipped) r.add_nonfinite_ranks(1);
      if (slot.rank == 1) {
        for (int mb = 0; mb < 4; ++mb) r.add_microbatch_losses(skipped ? std::nan("") : 1.0);
      }
      if (!eval.empty()) {
        r.set_evaluated(true);
        if (slot.rank == 1) {
          for (int i = 0; i < 8; ++i) r.add_eval_microbatch_losses(eval[slot.replica]);
        }
      }
      EXPECT_TRUE(aggregator.CheckLocked(job, slot, r).ok());
      completed = aggregator.AddLocked(job, slot, r, kT0);
    }
    return completed;
  };
  ASSERT_TRUE(step(0, false, {}));
  ASSERT_TRUE(step(1, true, {0.5, 1.5}));  // replica 0's eval losses 0.5, replica 1's 1.5
  EXPECT_EQ(job.losses[0], 1.0);
  EXPECT_TRUE(std::isnan(job.losses[1]));
  const v1::StepCompleted skipped = job.events.Since(0).events.back().step_completed();
  EXPECT_FALSE(skipped.has_loss());
  EXPECT_TRUE(skipped.skipped());
  EXPECT_THAT(skipped.nonfinite_ranks(), ElementsAre(1));
  EXPECT_DOUBLE_EQ(skipped.learning_rate(), 0.05);
  EXPECT_FALSE(skipped.has_grad_norm());
  EXPECT_DOUBLE_EQ(skipped.eval_loss(), 1.0);  // the mean of both replicas' shares
  ASSERT_EQ(job.training.evals.size(), 1u);
  EXPECT_EQ(job.training.evals[0].global_step(), 1);
  EXPECT_EQ(job.training.ConsecutiveSkipped(), 1);
  EXPECT_TRUE(job.step_failure.empty());
  ASSERT_TRUE(step(2, true, {}));
  EXPECT_THAT(job.training.skipped_steps, ElementsAre(1, 2));
  EXPECT_EQ(job.step_failure,
            "2 steps in a row (global steps 1 to 2) were skipped for non-finite gradients, the "
            "last on pipeline rank(s) 1 (training.max_skipped_steps: 2)");
  v1::Job record;
  job.ToProto(&record);
  EXPECT_THAT(record.skipped_steps(), ElementsAre(1, 2));
  EXPECT_EQ(record.consecutive_skipped_steps(), 2);
  EXPECT_DOUBLE_EQ(record.learning_rate(), 0.1 / 3);

  // The last stage's rank of an eval step must send eval.batches x microbatches losses.
  v1::ReportStepRequest short_eval;
  short_eval.set_rank(1);
  short_eval.set_step(3);
  for (int mb = 0; mb < 4; ++mb) short_eval.add_microbatch_losses(1.0);
  short_eval.set_evaluated(true);
  short_eval.add_eval_microbatch_losses(1.0);
  job.ranks[1].steps_done = 3;
  EXPECT_THAT(aggregator.CheckLocked(job, job.ranks[1], short_eval).message(),
              HasSubstr("eval_microbatch_losses: the last stage's rank must report "
                        "eval.batches x slices x microbatches (8) losses, got 1"));
}

// The loss normalised by tokens: each eval microbatch's loss weighs by the tokens it counted, so
// the eval loss is every counted token's loss over their count whatever the replicas' shares.
TEST(StepAggregation, EvalLossesWithTokenCountsAreTheTokensMeanNotTheMicrobatchesMean) {
  JobTable table{{}, nullptr};
  StepAggregator aggregator{nullptr};
  absl::MutexLock lock(&table.mu());
  // 2 ranks x 2 replicas, 4 microbatches, eval of 2 batches after every step.
  Job& job = QueueJob(table, absl::StrCat(Spec(2, ""),
                                          "placement: {replicas: 2}\n"
                                          "eval: {every_steps: 1, batches: 2, "
                                          "data: {seed: 1}}\n"));
  for (int replica = 0; replica < 2; ++replica) {
    for (int r = 0; r < 2; ++r) {
      RankSlot& slot = job.ranks.emplace_back();
      slot.rank = r;
      slot.replica = replica;
    }
  }
  // Replica 0: losses 0.5 over 10 tokens each, but one microbatch counted none (loss 0);
  // replica 1: 1.5 over 30 tokens each.
  auto report = [](const RankSlot& slot) {
    v1::ReportStepRequest r;
    r.set_rank(slot.rank);
    r.set_replica(slot.replica);
    r.set_step(0);
    r.set_learning_rate(0.1);
    r.set_evaluated(true);
    if (slot.rank == 1) {
      for (int mb = 0; mb < 4; ++mb) r.add_microbatch_losses(1.0);
      for (int i = 0; i < 8; ++i) {
        const bool none = slot.replica == 0 && i == 3;
        r.add_eval_microbatch_losses(none ? 0.0 : slot.replica == 0 ? 0.5 : 1.5);
        r.add_eval_microbatch_tokens(none ? 0 : slot.replica == 0 ? 10 : 30);
      }
    }
    return r;
  };
  bool completed = false;
  for (RankSlot& slot : job.ranks) {
    const v1::ReportStepRequest r = report(slot);
    ASSERT_TRUE(aggregator.CheckLocked(job, slot, r).ok());
    completed = aggregator.AddLocked(job, slot, r, kT0);
  }
  ASSERT_TRUE(completed);
  const v1::StepCompleted done = job.events.Since(0).events.back().step_completed();
  EXPECT_DOUBLE_EQ(done.eval_loss(), (0.5 * 70 + 1.5 * 240) / 310.0);
  ASSERT_EQ(job.training.evals.size(), 1u);
  EXPECT_DOUBLE_EQ(job.training.evals[0].loss(), done.eval_loss());

  // Counts that do not pair with the losses are refused, naming the field.
  v1::ReportStepRequest odd = report(job.ranks[1]);
  odd.set_step(1);
  job.ranks[1].steps_done = 1;
  odd.mutable_eval_microbatch_tokens()->RemoveLast();
  EXPECT_THAT(aggregator.CheckLocked(job, job.ranks[1], odd).message(),
              HasSubstr("eval_microbatch_tokens: one count per eval microbatch loss (8), got 7"));
  odd = report(job.ranks[1]);
  odd.set_step(1);
  odd.set_eval_microbatch_tokens(2, -4);
  EXPECT_THAT(aggregator.CheckLocked(job, job.ranks[1], odd).message(),
              HasSubstr("eval_microbatch_tokens: a negative count -4"));
}

TEST_F(StepAggregationTest, ReportsThatDoNotFitAreRefusedNamingTheField) {
  absl::MutexLock lock(&table_.mu());
  Job& job = *job_;
  auto wrong_step = aggregator_.CheckLocked(job, job.ranks[0], Report(0, 3, {}, 0));
  EXPECT_THAT(std::string(wrong_step.message()), HasSubstr("step: rank 0 reported step 3"));
  auto losses = aggregator_.CheckLocked(job, job.ranks[1], Report(1, 0, {1.0}, 0));
  EXPECT_THAT(std::string(losses.message()), HasSubstr("microbatch_losses"));
  v1::ReportStepRequest timings = Report(0, 0, {}, 0);
  timings.add_action_timings();
  EXPECT_THAT(std::string(aggregator_.CheckLocked(job, job.ranks[0], timings).message()),
              HasSubstr("action_timings"));
  v1::ReportStepRequest forward;
  forward.set_rank(1);
  forward.set_forward_only_step(true);
  EXPECT_THAT(std::string(aggregator_.AddForwardOnlyLocked(job, job.ranks[1], forward).message()),
              HasSubstr("none is in flight"));
}

// --- Failure investigation and the restart policy ---

TEST(FailureInvestigation, ALostPeerIsTheRootCauseElseTheReporter) {
  FakeWorkerClient workers;
  FailureInvestigation investigation(&workers, absl::Seconds(1));
  const ReportedFailure reported{1, "w-2", "rank 1, action 1RECV_F0: connection reset"};
  const std::vector<Peer> peers = {{0, "w-1", "10.0.0.1:7000"}, {2, "w-3", "10.0.0.3:7000"}};
  RootCause healthy = investigation.Investigate(reported, peers);
  EXPECT_EQ(healthy.reason,
            "rank 1 (worker w-2) failed: rank 1, action 1RECV_F0: connection reset");
  EXPECT_EQ(healthy.failure.action(), "1RECV_F0");
  EXPECT_TRUE(healthy.lost.empty());
  workers.SetUnreachable("10.0.0.3:7000");
  RootCause lost = investigation.Investigate(reported, peers);
  EXPECT_EQ(lost.failure.rank(), 2);
  EXPECT_EQ(lost.failure.worker_id(), "w-3");
  EXPECT_THAT(lost.reason, HasSubstr("worker w-3 (rank 2) lost: unreachable"));
  EXPECT_THAT(lost.reason, HasSubstr("(rank 1 reported: rank 1, action"));
  ASSERT_EQ(lost.lost.size(), 1u);
  EXPECT_EQ(lost.lost[0].first, "w-3");
}

TEST(RestartPolicy, RestartsWhileAllowedFromTheLatestCheckpoint) {
  JobTable table({}, nullptr);
  absl::MutexLock lock(&table.mu());
  Job& job = QueueJob(table, Spec(2, "}\nrestart: {max_restarts: 2"));
  RestartDecision first = DecideRestart(job, "w-2 lost");
  EXPECT_TRUE(first.restart);
  EXPECT_EQ(first.reason,
            "w-2 lost; restart 1 of 2 from its initial parameters (no checkpoint yet)");
  job.restarts = 1;
  job.checkpoints.emplace_back().set_step(40);
  EXPECT_EQ(DecideRestart(job, "x").reason, "x; restart 2 of 2 from the checkpoint after step 40");
  job.restarts = 2;
  RestartDecision none = DecideRestart(job, "x");
  EXPECT_FALSE(none.restart);
  EXPECT_EQ(none.reason, "x (no restart left: max_restarts 2 used)");
  job.restarts = 0;
  job.inference = true;
  EXPECT_FALSE(DecideRestart(job, "x").restart) << "an Infer job never restarts";
}

// --- The job lifecycle ---

class Hooks : public LifecycleHooks {
 public:
  void ScheduleLocked() override { ++schedules; }
  void AttemptStartedLocked(Job& job) override { started.push_back(job.id); }
  void ReplicaLostLocked(Job& job) override { replicas_lost.push_back(job.id); }
  int schedules = 0;
  std::vector<std::string> started;
  std::vector<std::string> replicas_lost;
};

class JobLifecycleTest : public ::testing::Test {
 protected:
  JobLifecycleTest()
      : registry_(absl::Seconds(10)),
        table_({}, nullptr),
        placement_(TaskSettings{}, &registry_),
        lifecycle_({}, LifecycleDeps{&table_, &registry_, &workers_, &kv_, &executor_, &clock_,
                                     nullptr, &hooks_}) {}

  // A two-rank job placed on w-1 and w-2, its StartTask calls queued.
  Job& PlaceJob(const std::string& extra = "") {
    Register(registry_, 1);
    Register(registry_, 2);
    absl::MutexLock lock(&table_.mu());
    Job& job = QueueJob(table_, Spec(2, extra));
    for (StartOrder& order : placement_.PlaceLocked(table_, kT0)) {
      lifecycle_.StartAttempt(std::move(order));
    }
    return job;
  }

  FakeClock clock_;
  FakeWorkerClient workers_;
  KvStore kv_;
  ManualExecutor executor_;
  Hooks hooks_;
  WorkerRegistry registry_;
  JobTable table_;
  Placement placement_;
  JobLifecycle lifecycle_;
};

TEST_F(JobLifecycleTest, AStartedAttemptRunsAndEndingItStopsItsRanks) {
  Job& job = PlaceJob();
  executor_.RunUntilIdle();
  EXPECT_EQ(job.state, v1::JOB_STATE_RUNNING);
  EXPECT_THAT(hooks_.started, ElementsAre("job-1"));
  EXPECT_EQ(workers_.Started("10.0.0.2:7000").size(), 1u);
  // The job ends: its live ranks are stopped and their workers released.
  {
    absl::MutexLock lock(&table_.mu());
    lifecycle_.EndLocked(job, v1::JOB_STATE_CANCELLED, "not needed");
  }
  EXPECT_TRUE(workers_.Stopped("10.0.0.1:7000").empty()) << "stopped off the lock, later";
  executor_.RunUntilIdle();
  EXPECT_THAT(workers_.Stopped("10.0.0.1:7000"), ElementsAre("job-1"));
  EXPECT_EQ(registry_.Find("w-1")->state, v1::WORKER_STATE_IDLE);
  EXPECT_GE(hooks_.schedules, 2);
}

TEST_F(JobLifecycleTest, AWorkerThatCannotBeReachedAtStartIsLostAndTheJobRestarts) {
  workers_.SetUnreachable("10.0.0.2:7000");
  Job& job = PlaceJob("}\nrestart: {max_restarts: 1");
  executor_.RunUntilIdle();
  EXPECT_EQ(job.state, v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(job.restarts, 1);
  EXPECT_EQ(job.failure->rank(), 1);
  EXPECT_THAT(job.failure->error(), HasSubstr("StartTask: connection refused"));
  EXPECT_EQ(registry_.Find("w-2")->state, v1::WORKER_STATE_LOST);
  EXPECT_THAT(workers_.Stopped("10.0.0.1:7000"), ElementsAre("job-1"))
      << "rank 0 had started: it is stopped";
}

// --- Checkpoint collection ---

class CheckpointCollectionTest : public ::testing::Test {
 protected:
  v1::ReportStepRequest Files(int rank, int64_t step, const std::string& contents) {
    const std::string step_dir = CheckpointStepDirectory(dir_, step);
    std::filesystem::create_directories(step_dir);
    const std::string name = absl::StrCat("stage-", rank, ".pt");
    std::ofstream(step_dir + "/" + name) << contents;
    v1::ReportStepRequest r;
    r.set_rank(rank);
    r.set_step(step - 1);
    v1::StageCheckpointFile* f = r.add_checkpoint_files();
    f->set_stage(rank);
    f->set_file(name);
    f->set_size_bytes(static_cast<int64_t>(contents.size()));
    f->set_sha256(Sha256Hex(contents));
    return r;
  }
  stagecoach::testing::TempDir tmp_{"checkpoint_collection"};
  const std::string dir_ = tmp_.path();
};

TEST_F(CheckpointCollectionTest, AManifestIsWrittenOnlyOnceEveryStagesFilesAreOnDisk) {
  JobTable table({}, nullptr);
  absl::MutexLock lock(&table.mu());
  Job& job = QueueJob(table, Spec(2, absl::StrCat(", checkpoint: {dir: ", dir_, "}")));
  const auto rank0 = Files(0, 2, "zero");
  ASSERT_TRUE(ValidateCheckpointReport(job, rank0).ok());
  EXPECT_FALSE(AddReportedFilesLocked(job, rank0).has_value()) << "stage 1 has not reported";
  std::optional<PendingManifest> pending = AddReportedFilesLocked(job, Files(1, 2, "one"));
  ASSERT_TRUE(pending.has_value());
  EXPECT_EQ(pending->manifest.step, 2);
  EXPECT_EQ(pending->step_dir, CheckpointStepDirectory(dir_, 2));
  EXPECT_TRUE(job.checkpoint_files.empty());
  ASSERT_TRUE(WritePendingManifest(*pending).ok());
  RecordCheckpointLocked(job, *pending);
  ASSERT_EQ(job.checkpoints.size(), 1u);
  EXPECT_EQ(job.checkpoint_stage_files[2].size(), 2u);
  EXPECT_TRUE(VerifyCheckpoint(pending->step_dir).ok());
  // A file that is not what its rank reported leaves the checkpoint without a manifest.
  AddReportedFilesLocked(job, Files(0, 3, "zero"));
  pending = AddReportedFilesLocked(job, Files(1, 3, "one"));
  std::ofstream(CheckpointStepDirectory(dir_, 3) + "/stage-1.pt") << "longer now";
  absl::Status written = WritePendingManifest(*pending);
  EXPECT_TRUE(absl::IsDataLoss(written)) << written;
  EXPECT_THAT(std::string(written.message()), HasSubstr("stage-1.pt (stage 1)"));
  EXPECT_FALSE(std::filesystem::exists(ManifestPath(CheckpointStepDirectory(dir_, 3))));
  // A report of another rank's stage is refused.
  v1::ReportStepRequest foreign = Files(0, 4, "x");
  foreign.set_rank(1);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateCheckpointReport(job, foreign)));
}

// --- Recovery ---

TEST(Recovery, AJobIsRebuiltByReplayingItsHistory) {
  JobTable table({}, nullptr);
  v1::Job record;
  {
    absl::MutexLock lock(&table.mu());
    Job& job = QueueJob(table, Spec(2));
    ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_STARTING, "placed", kT0).ok());
    ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_RUNNING, "go", kT0 + absl::Seconds(1)).ok());
    job.losses = {1.5};
    job.restarts = 1;
    job.attempt = 2;
    job.ToRecord(&record);
  }
  auto rebuilt = RebuildJob(record);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_TRUE(rebuilt->recovering) << "it had not ended: planned again in the background";
  Job& job = *rebuilt->job;
  EXPECT_EQ(job.state, v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.history.size(), 4u);
  EXPECT_EQ(job.events.size(), 4) << "every replayed transition is an event again";
  EXPECT_THAT(job.losses, ElementsAre(1.5));
  EXPECT_EQ(job.attempt, 2);
  EXPECT_EQ(job.plan.num_stages, 2);
  EXPECT_TRUE(job.plan.lowered.empty()) << "not planned yet";
  RecoveredState state = PrepareRecovery(RecoveryInput::Of(job));
  ASSERT_TRUE(state.plan.ok()) << state.plan.status();
  EXPECT_FALSE(state.inference);
  ApplyRecovery(job, std::move(state));
  EXPECT_FALSE(job.recovering);
  EXPECT_EQ(job.plan.lowered.size(), 2u);
  EXPECT_EQ(job.plan.stages[1].first_layer, 2) << "the recorded partition";

  v1::Job forged = record;
  forged.mutable_history(2)->set_state(v1::JOB_STATE_SUCCEEDED);  // PENDING -> SUCCEEDED
  auto refused = RebuildJob(forged);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("not a path of the job state"));
  v1::Job unparsable = record;
  unparsable.set_spec_yaml("name: [");
  EXPECT_THAT(std::string(RebuildJob(unparsable).status().message()),
              HasSubstr("its spec no longer parses"));
}

// --- Admission ---

std::string TorchScriptSpec(const std::string& device = "cpu") {
  return absl::StrCat("name: t\nmodel: {torchscript: /models/m.pt}\nsplit: {stages: 2}\n",
                      "schedule: {kind: GPipe, microbatches: 2}\nplacement: {device: ", device,
                      "}\ntraining: {batch_size: 4, steps: 1}\n",
                      "data: {kind: tensors, path: /data/train.pt}\n");
}

TEST(Admission, BuiltinModelsNeedNoWorkerAndTorchScriptOnesAreInspectedByOne) {
  WorkerRegistry registry(absl::Seconds(10));
  FakeWorkerClient workers;
  Admission admission({absl::Seconds(5), 0}, &registry, &workers);
  auto builtin = admission.AdmitTraining(Spec(2), "spec.yaml");
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  EXPECT_EQ(builtin->plan.num_stages, 2);
  EXPECT_FALSE(builtin->resume.has_value());
  auto refused = admission.AdmitTraining("name: x\n", "bad.yaml");
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));

  auto no_worker = admission.AdmitTraining(TorchScriptSpec(), "ts.yaml");
  EXPECT_TRUE(absl::IsFailedPrecondition(no_worker.status())) << no_worker.status();
  EXPECT_THAT(std::string(no_worker.status().message()), HasSubstr("no live worker"));
  ASSERT_TRUE(registry.Register("busy", "10.0.0.1:7000", "cpu", {}, kT0).ok());
  ASSERT_TRUE(registry.Register("idle", "10.0.0.2:7000", "cpu", {}, kT0).ok());
  ASSERT_TRUE(registry.Assign("w-1", "job-9", 0).ok());
  v1::InspectModelResponse inspected;
  for (const char* name : {"a", "b", "c"}) inspected.add_layers()->set_name(name);
  workers.SetInspection(inspected);
  auto admitted = admission.AdmitTraining(TorchScriptSpec(), "ts.yaml");
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(admitted->plan.layers.size(), 3u);
  EXPECT_EQ(workers.Inspected("10.0.0.2:7000").size(), 1u) << "the idle worker is asked";
  workers.SetInspection(absl::InvalidArgumentError("model.torchscript: cannot load"));
  auto bad_model = admission.AdmitTraining(TorchScriptSpec(), "ts.yaml");
  EXPECT_THAT(std::string(bad_model.status().message()),
              HasSubstr("model.torchscript: cannot load (inspected by worker w-2)"));
}

TEST(Admission, AnInferenceBatchMustFitTheMicrobatches) {
  WorkerRegistry registry(absl::Seconds(10));
  FakeWorkerClient workers;
  Admission admission({}, &registry, &workers);
  v1::TensorData rows;
  rows.set_dtype("float32");
  rows.add_shape(3);
  rows.add_shape(4);
  rows.set_data(std::string(48, '\0'));
  auto refused = admission.AdmitInference(Spec(2), "infer.yaml", rows);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("schedule.microbatches: must be <= the rows of inputs"));
  rows.set_shape(0, 8);
  rows.set_data(std::string(128, '\0'));
  auto admitted = admission.AdmitInference(Spec(2), "infer.yaml", rows);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(admitted->spec.schedule.kind, "ForwardOnly");
  EXPECT_EQ(admitted->spec.training.batch_size, 8);
  EXPECT_FALSE(admitted->plan.has_backward);
}

}  // namespace
}  // namespace stagecoach::coordinator::coordinator_components_test
