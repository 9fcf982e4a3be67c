// A job's per-step history: no loss is invented or lost across a coordinator restart (a
// checkpoint recorded before its step's loss is not restarted from; a gap is NaN and named
// missing, never 0), and views of the job carry a bounded window of it (GetJob's summary and
// pages, ListJobs' rows).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "coordinator/control/step_aggregation.h"
#include "coordinator/lifecycle/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::job_history_test {
namespace {

using ::testing::ElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

std::string Spec() {
  return "name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n"
         "split: {stages: 2}\nschedule: {kind: GPipe, microbatches: 4}\n"
         "training: {batch_size: 8, steps: 300, checkpoint: {dir: /ckpt, every_steps: 20}}\n";
}

void AddCheckpoint(Job& job, int64_t step) {
  v1::JobCheckpoint& c = job.checkpoints.emplace_back();
  c.set_step(step);
  c.set_directory(absl::StrCat("/ckpt/step-", step));
  for (int s = 0; s < 2; ++s) {
    v1::StageCheckpointFile f;
    f.set_stage(s);
    f.set_file(absl::StrCat("stage-", s, ".pt"));
    job.checkpoint_stage_files[step].push_back({f});
  }
}

// The case of the hostile-use report: the coordinator stopped at step 149 of a job that
// checkpoints every 20 steps, after the checkpoint after step 139 (step 140) was recorded
// but before step 139's loss was.
TEST(JobHistory, ARestartDoesNotStartPastTheLossesOnRecord) {
  WorkerRegistry registry(absl::Seconds(10));
  JobTable table({}, nullptr);
  Placement placement(TaskSettings{}, &registry);
  for (int n = 1; n <= 2; ++n) {
    ASSERT_TRUE(
        registry.Register(absl::StrCat("w", n), absl::StrCat("10.0.0.", n, ":7000"), "cpu", {}, kT0)
            .ok());
  }
  absl::MutexLock lock(&table.mu());
  Job& job = QueuePlannedJob(table, Spec(), kT0);
  ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_STARTING, "placed", kT0).ok());
  ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_RUNNING, "started", kT0).ok());
  ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_RESTARTING, "the coordinator restarted", kT0).ok());
  for (int i = 0; i < 139; ++i) job.losses.push_back(1.0 + i);
  job.max_bubble_ratios.assign(139, 0.5);
  AddCheckpoint(job, 120);
  AddCheckpoint(job, 140);
  std::vector<StartOrder> orders = placement.PlaceLocked(table, kT0);
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(job.attempt_base, 120) << "step 139 has no loss on record: start before it";
  ASSERT_EQ(job.checkpoints.size(), 1u);
  EXPECT_EQ(job.checkpoints.back().step(), 120);
  EXPECT_EQ(job.checkpoint_stage_files.count(140), 0u);
  EXPECT_EQ(orders[0].set_aside_after, 120) << "the later checkpoint is set aside and redone";
  EXPECT_EQ(orders[0].tasks[0].second.resume().step(), 120);
  EXPECT_EQ(job.losses.size(), 120u);
}

TEST(JobHistory, AStepAfterAGapMarksTheGapMissingNeverZero) {
  JobTable table({}, nullptr);
  StepAggregator aggregator(nullptr);
  absl::MutexLock lock(&table.mu());
  Job& job = QueuePlannedJob(table, Spec(), kT0);
  for (int r = 0; r < 2; ++r) job.ranks.emplace_back().rank = r;
  job.losses = {3.0, 2.0};
  job.max_bubble_ratios = {0.5, 0.5};
  job.attempt_base = 3;  // step 2's record was lost
  for (int rank : {1, 0}) {
    v1::ReportStepRequest r;
    r.set_rank(rank);
    r.set_step(0);
    if (rank == 1) {
      for (int i = 0; i < 4; ++i) r.add_microbatch_losses(1.0);
    }
    r.mutable_step_time()->set_seconds(1);
    ASSERT_TRUE(aggregator.CheckLocked(job, job.ranks[rank], r).ok());
    aggregator.AddLocked(job, job.ranks[rank], r, kT0);
  }
  ASSERT_EQ(job.losses.size(), 4u);
  EXPECT_EQ(job.losses[1], 2.0);
  EXPECT_TRUE(std::isnan(job.losses[2])) << "not 0.0";
  EXPECT_EQ(job.losses[3], 1.0);
  EXPECT_THAT(job.missing_loss_steps, ElementsAre(2));
  v1::Job shown;
  job.ToProto(&shown);
  EXPECT_THAT(shown.missing_loss_steps(), ElementsAre(2));
}

TEST(JobHistory, ViewsCarryABoundedWindowOfTheHistory) {
  JobTable table({}, nullptr);
  absl::MutexLock lock(&table.mu());
  Job& job = QueuePlannedJob(table, Spec(), kT0);
  for (int i = 0; i < 250; ++i) {
    job.losses.push_back(i);
    job.max_bubble_ratios.push_back(i / 1000.0);
    if (i % 50 == 0) job.training.AddEval(i, i);
  }
  job.training.skipped_steps = {10, 240};
  ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_STARTING, "placed", kT0).ok());
  ASSERT_TRUE(job.TransitionTo(v1::JOB_STATE_RUNNING, "started", kT0).ok());
  for (int i = 0; i < 120; ++i) {  // pause/resume cycles
    ASSERT_TRUE(
        job.TransitionTo(i % 2 == 0 ? v1::JOB_STATE_PAUSED : v1::JOB_STATE_RUNNING, "cycle", kT0)
            .ok());
  }
  const int64_t transitions = static_cast<int64_t>(job.history.size());

  v1::Job whole;
  job.ToProto(&whole);
  EXPECT_EQ(whole.losses_size(), 250);
  EXPECT_EQ(whole.history_first_step(), 0);
  EXPECT_EQ(whole.evals_size(), 5);
  EXPECT_EQ(whole.history_size(), transitions);

  v1::Job summary;
  job.ToProto(&summary, HistoryWindow::Summary());
  EXPECT_EQ(summary.losses_size(), 100);
  EXPECT_EQ(summary.history_first_step(), 150);
  EXPECT_EQ(summary.losses(0), 150.0);
  EXPECT_EQ(summary.max_bubble_ratios_size(), 100);
  EXPECT_THAT(summary.skipped_steps(), ElementsAre(240));
  EXPECT_EQ(summary.evals_size(), 2);  // steps 150 and 200
  EXPECT_EQ(summary.history_size(), std::min<int64_t>(transitions, 100));
  EXPECT_EQ(summary.history_transitions_omitted(), transitions - summary.history_size());

  v1::Job page;
  job.ToProto(&page, HistoryWindow::Page(5, 10));
  EXPECT_EQ(page.history_first_step(), 5);
  ASSERT_EQ(page.losses_size(), 10);
  EXPECT_EQ(page.losses(9), 14.0);
  EXPECT_THAT(page.skipped_steps(), ElementsAre(10));
  v1::Job past_end;
  job.ToProto(&past_end, HistoryWindow::Page(400, 10));
  EXPECT_EQ(past_end.losses_size(), 0);

  v1::Job row;
  job.ToSummary(&row);
  EXPECT_THAT(row.losses(), ElementsAre(249.0)) << "a list row: the latest loss only";
  EXPECT_EQ(row.history_size(), 0);
  EXPECT_EQ(row.evals_size(), 0);
  EXPECT_TRUE(row.spec_yaml().empty());
}

}  // namespace
}  // namespace stagecoach::coordinator::job_history_test
