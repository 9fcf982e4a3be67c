// JobManager's step control, restarts and job table with fake workers and a fake clock: pause,
// resume, run N more steps and client batch steps steer the same attempt through ControlTask;
// a lost worker restarts a job that has restarts left; a coordinator that starts again from
// its job table continues the jobs it had placed.
#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/job_manager.h"
#include "coordinator/jobs/job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::job_manager_control_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Spec(int steps, const std::string& extra = "") { return TwoStageSpec(steps, extra); }

v1::TensorData Floats(int64_t rows, int64_t cols) { return ZeroFloats(rows, cols); }

class JobManagerControlTest : public JobManagerFixture {
 protected:
  v1::Job Job(const std::string& id) {
    auto job = manager_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }
  v1::JobState State(const std::string& id) { return Job(id).state(); }

  // Rank `rank` of attempt `attempt` reports task-local step `step`.
  absl::Status Step(const std::string& job, const std::string& worker, int rank, int step,
                    int attempt = 1) {
    v1::ReportStepRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(attempt);
    r.set_rank(rank);
    r.set_step(step);
    if (rank == 1) {
      for (int i = 0; i < 4; ++i) r.add_microbatch_losses(step + 1.0);
    }
    return manager_->ReportStep(r);
  }
  // Both ranks (workers a, b) report step `step`.
  void StepBoth(const std::string& job, const std::string& a, const std::string& b, int step,
                int attempt = 1) {
    ASSERT_TRUE(Step(job, a, 0, step, attempt).ok());
    ASSERT_TRUE(Step(job, b, 1, step, attempt).ok());
  }
  absl::Status End(const std::string& job, const std::string& worker, int rank, int attempt = 1) {
    v1::ReportTaskEndRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(attempt);
    r.set_rank(rank);
    r.set_outcome(v1::TASK_OUTCOME_SUCCEEDED);
    return manager_->ReportTaskEnd(r);
  }
  std::vector<v1::JobState> History(const std::string& id) {
    std::vector<v1::JobState> out;
    const v1::Job job = Job(id);
    for (const auto& t : job.history()) out.push_back(t.state());
    return out;
  }
};

// A rank refuses a client batch (rank 1 here, after rank 0 took it): rank 0 is told to hold
// again before StepJob answers, not by a message sent later that could reach it after a Resume
// and stop the steps the Resume started (the job then failed, "step_limit 0 is below..."); the
// rank that refused is told nothing more, and the job stays PAUSED.
TEST_F(JobManagerControlTest, ARefusedClientStepIsWithdrawnBeforeStepJobAnswers) {
  Register(1);
  Register(2);
  auto id = manager_->SubmitJob(Spec(4), "spec.yaml", /*start_paused=*/true);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_PAUSED; }));
  workers_.SetControlAnswer(
      Address(2), [](const v1::ControlTaskRequest& r) -> absl::StatusOr<v1::ControlTaskResponse> {
        if (r.has_client_step()) return absl::InvalidArgumentError("client_step.targets: no");
        v1::ControlTaskResponse ok;
        ok.set_global_steps_done(0);
        return ok;
      });
  v1::StepJobRequest step;
  step.set_job_id(*id);
  *step.mutable_inputs() = Floats(8, 4);
  *step.mutable_targets() = Floats(8, 2);
  const size_t before = workers_.Controls(Address(2)).size();
  auto refused = manager_->StepJob(step, absl::Seconds(5));
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  std::vector<v1::ControlTaskRequest> to0 = workers_.Controls(Address(1));
  ASSERT_GE(to0.size(), 2u);
  EXPECT_TRUE(to0[to0.size() - 2].has_client_step());
  EXPECT_FALSE(to0.back().has_client_step()) << "rank 0 still holds the refused batch";
  EXPECT_EQ(to0.back().step_limit(), 0);
  EXPECT_EQ(workers_.Controls(Address(2)).size(), before + 1) << "only the refused request";
  EXPECT_EQ(State(*id), v1::JOB_STATE_PAUSED);

  ASSERT_TRUE(manager_->ResumeJob(*id).ok());
  absl::SleepFor(absl::Milliseconds(200));  // a late withdrawal would land here
  to0 = workers_.Controls(Address(1));
  EXPECT_EQ(to0.back().step_limit(), 4) << "something reached rank 0 after the resume";
  EXPECT_EQ(workers_.Controls(Address(2)).back().step_limit(), 4);
  EXPECT_EQ(State(*id), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerControlTest, PauseRunStepAndResumeSteerTheSameAttempt) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(Spec(4), "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  const v1::TaskAssignment task = workers_.Started(Address(1)).at(0);
  EXPECT_EQ(task.step_limit(), 4);
  EXPECT_FALSE(task.finish_at_limit());
  EXPECT_GT(task.hold_timeout().seconds(), 0);

  StepBoth(*id, w1, w2, 0);
  // Rank 0 is inside step 1 already: the earliest boundary no rank has passed is 2.
  ASSERT_TRUE(Step(*id, w1, 0, 1).ok());
  auto paused = manager_->PauseJob(*id);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->global_step(), 3);
  EXPECT_EQ(workers_.Controls(Address(2)).back().step_limit(), 3);
  EXPECT_EQ(State(*id), v1::JOB_STATE_RUNNING) << "not every rank holds yet";
  ASSERT_TRUE(Step(*id, w2, 1, 1).ok());
  StepBoth(*id, w1, w2, 2);
  EXPECT_EQ(State(*id), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(Job(*id).pause_at_global_step(), 3);
  EXPECT_EQ(Job(*id).attempt(), 1);
  // Pausing again answers where it holds.
  EXPECT_EQ(manager_->PauseJob(*id)->global_step(), 3);

  // A client batch step on the paused job: inputs to stage 0's rank, targets to the last's.
  v1::StepJobRequest step;
  step.set_job_id(*id);
  *step.mutable_inputs() = Floats(8, 4);
  EXPECT_TRUE(absl::IsInvalidArgument(manager_->StepJob(step, absl::Seconds(1)).status()))
      << "a training step needs targets";
  *step.mutable_targets() = Floats(7, 2);
  auto wrong_rows = manager_->StepJob(step, absl::Seconds(1));
  EXPECT_THAT(std::string(wrong_rows.status().message()), HasSubstr("targets"));
  *step.mutable_targets() = Floats(8, 2);
  absl::StatusOr<v1::StepJobResponse> stepped;
  std::thread client([&] { stepped = manager_->StepJob(step, absl::Seconds(10)); });
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  const v1::ControlTaskRequest to0 = workers_.Controls(Address(1)).back();
  const v1::ControlTaskRequest to1 = workers_.Controls(Address(2)).back();
  EXPECT_EQ(to0.step_limit(), 4);
  EXPECT_EQ(to0.client_step().global_step(), 3);
  EXPECT_TRUE(to0.client_step().has_inputs());
  EXPECT_FALSE(to0.client_step().has_targets());
  EXPECT_FALSE(to1.client_step().has_inputs());
  EXPECT_TRUE(to1.client_step().has_targets());
  EXPECT_EQ(to1.client_step().inputs_shape_size(), 2);
  StepBoth(*id, w1, w2, 3);
  client.join();
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_EQ(stepped->global_step(), 3);
  EXPECT_EQ(stepped->microbatch_losses_size(), 4);
  EXPECT_EQ(stepped->loss(), 4.0);
  EXPECT_EQ(State(*id), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(Job(*id).global_steps_done(), 4);

  // Run 2 more: past the job's 4 steps, so its end (and steps_total) moves to 6.
  auto ran = manager_->RunSteps(*id, 2);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->until_global_step(), 6);
  EXPECT_EQ(Job(*id).steps_total(), 6);
  StepBoth(*id, w1, w2, 4);
  EXPECT_EQ(State(*id), v1::JOB_STATE_RUNNING);
  StepBoth(*id, w1, w2, 5);
  EXPECT_EQ(State(*id), v1::JOB_STATE_PAUSED);
  EXPECT_TRUE(absl::IsFailedPrecondition(manager_->ResumeJob("nope").status()) ||
              absl::IsNotFound(manager_->ResumeJob("nope").status()));

  // Resume at the end: the ranks are told to finish.
  ASSERT_TRUE(manager_->ResumeJob(*id).ok());
  ASSERT_TRUE(Eventually([&] { return workers_.Controls(Address(2)).back().finish_at_limit(); }));
  EXPECT_EQ(workers_.Controls(Address(2)).back().step_limit(), 6);
  ASSERT_TRUE(End(*id, w1, 0).ok());
  ASSERT_TRUE(End(*id, w2, 1).ok());
  EXPECT_EQ(State(*id), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Job(*id).losses_size(), 6);
  EXPECT_EQ(workers_.Started(Address(1)).size(), 1u) << "no resubmission";
  EXPECT_THAT(
      History(*id),
      ::testing::ElementsAre(v1::JOB_STATE_PLANNING, v1::JOB_STATE_PENDING, v1::JOB_STATE_STARTING,
                             v1::JOB_STATE_RUNNING, v1::JOB_STATE_PAUSED, v1::JOB_STATE_RUNNING,
                             v1::JOB_STATE_PAUSED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_PAUSED,
                             v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED));
  EXPECT_TRUE(absl::IsFailedPrecondition(manager_->PauseJob(*id).status()));
}

// The hostile-use report: a pause whose client gave up (its deadline passed while a worker was
// slow to answer) took effect later. It must not: the ranks are told to run on.
TEST_F(JobManagerControlTest, APauseWhoseClientWentAwayIsWithdrawnNotAppliedLater) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(Spec(10), "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  StepBoth(*id, w1, w2, 0);
  std::atomic<bool> gone{false};
  // Rank 1's worker answers only after the client's deadline passed.
  workers_.SetControlAnswer(Address(2), [&](const v1::ControlTaskRequest& request) {
    gone = true;
    v1::ControlTaskResponse response;
    response.set_global_steps_done(1);
    return absl::StatusOr<v1::ControlTaskResponse>(response);
  });
  auto paused = manager_->PauseJob(*id, [&] { return gone.load(); });
  EXPECT_TRUE(absl::IsCancelled(paused.status())) << paused.status();
  EXPECT_THAT(std::string(paused.status().message()), HasSubstr("withdrawn"));
  v1::Job job = Job(*id);
  EXPECT_EQ(job.pause_at_global_step(), 0) << "no hold step was recorded";
  ASSERT_TRUE(Eventually([&] {
    const auto controls = workers_.Controls(Address(1));
    return !controls.empty() && controls.back().step_limit() == 10;
  })) << "the ranks are told to run on to the end";
  // The ranks pass the boundary the withdrawn pause had chosen; the job never turns PAUSED.
  StepBoth(*id, w1, w2, 1);
  StepBoth(*id, w1, w2, 2);
  EXPECT_EQ(State(*id), v1::JOB_STATE_RUNNING);
  // A client gone before anything was sent changes nothing.
  workers_.SetControlAnswer(Address(2), nullptr);
  const size_t sent = workers_.Controls(Address(1)).size();
  EXPECT_TRUE(absl::IsCancelled(manager_->PauseJob(*id, [] { return true; }).status()));
  EXPECT_EQ(workers_.Controls(Address(1)).size(), sent);
  // A client still there pauses it.
  auto again = manager_->PauseJob(*id, [] { return false; });
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->global_step(), 4);
}

TEST_F(JobManagerControlTest, ALostWorkerRestartsTheJobOnAFreeWorkerUntilNoRestartIsLeft) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  auto id = manager_->SubmitJob(Spec(5, "restart: {max_restarts: 1}\n"), "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  StepBoth(*id, w1, w2, 0);
  StepBoth(*id, w1, w2, 1);
  // w2 (rank 1) stops heartbeating; w1 and w3 keep theirs.
  clock_.Advance(absl::Seconds(4));
  for (const std::string& w : {w1, w3}) ASSERT_TRUE(Beat(w).ok());
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  v1::Job job = Job(*id);
  ASSERT_TRUE(job.state() == v1::JOB_STATE_RESTARTING || job.state() == v1::JOB_STATE_STARTING ||
              job.state() == v1::JOB_STATE_RUNNING)
      << job.reason();
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.failure().rank(), 1);
  EXPECT_EQ(job.failure().worker_id(), w2);
  // Rank 0's task is stopped; once w1 is free the job starts again on w1 and the spare w3.
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  EXPECT_EQ(workers_.Stopped(Address(1)).size(), 1u);
  ASSERT_EQ(workers_.Started(Address(3)).size(), 1u);
  const v1::TaskAssignment again = workers_.Started(Address(3)).at(0);
  EXPECT_EQ(again.attempt(), 2);
  EXPECT_FALSE(again.has_resume()) << "no checkpoint yet: from the initial parameters";
  job = Job(*id);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(job.losses_size(), 0) << "steps after the restart point are run again";
  EXPECT_THAT(History(*id), ::testing::Contains(v1::JOB_STATE_RESTARTING));
  // The first attempt's late reports are ignored.
  EXPECT_TRUE(Step(*id, w1, 0, 2, /*attempt=*/1).ok());
  EXPECT_EQ(Job(*id).steps_done(), 0);

  // Losing a worker again: no restart left.
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(Beat(w1).ok());
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  job = Job(*id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("no restart left"));
  EXPECT_THAT(job.reason(), HasSubstr(w3));
}

TEST_F(JobManagerControlTest, ARestartedCoordinatorContinuesItsJobsFromTheJobTable) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("jobtable-", getpid())).string();
  std::filesystem::remove_all(dir);
  auto store = FileJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  JobManagerOptions options;
  options.lease = absl::Seconds(5);
  options.heartbeat_interval = absl::Seconds(1);
  manager_ = std::make_unique<JobManager>(options, Deps(store->get()));
  const std::string w1 = Register(1), w2 = Register(2);
  auto done = manager_->SubmitJob(Spec(1), "a.yaml");
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(Eventually([&] { return State(*done) == v1::JOB_STATE_RUNNING; }));
  StepBoth(*done, w1, w2, 0);
  ASSERT_TRUE(End(*done, w1, 0).ok());
  ASSERT_TRUE(End(*done, w2, 1).ok());
  ASSERT_EQ(State(*done), v1::JOB_STATE_SUCCEEDED);
  auto running = manager_->SubmitJob(Spec(5), "b.yaml");
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(Eventually([&] { return State(*running) == v1::JOB_STATE_RUNNING; }));
  StepBoth(*running, w1, w2, 0);
  const int history = Job(*running).history_size();

  // The coordinator goes away and a new one reads the table.
  manager_.reset();
  FakeWorkerClient fresh_workers;
  KvStore fresh_kv;
  JobManagerDeps fresh{&clock_, &fresh_workers, &fresh_kv};
  fresh.store = store->get();
  fresh.executor = &executor_;
  JobManager again(options, fresh);
  EXPECT_THAT(again.Recover(), ::testing::IsEmpty());
  auto finished = again.GetJob(*done);
  ASSERT_TRUE(finished.ok());
  EXPECT_EQ(finished->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(finished->losses_size(), 1);
  // The record keeps no action lists: the ended job's schedule is refused, saying why, rather
  // than answered empty.
  auto schedule = again.GetJobSchedule(*done);
  EXPECT_TRUE(absl::IsFailedPrecondition(schedule.status())) << schedule.status();
  EXPECT_THAT(schedule.status().message(), HasSubstr("not kept on disk"));
  auto resumed = again.GetJob(*running);
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(resumed->history_size(), history + 1);
  EXPECT_THAT(resumed->reason(), HasSubstr("coordinator restarted"));
  EXPECT_EQ(resumed->restarts(), 0) << "a coordinator restart is not the job's";
  // Recover answered before planning anything: that happens in the background.
  EXPECT_THAT(resumed->reason(), HasSubstr("planning it again"));
  EXPECT_GT(executor_.pending(), 0);
  executor_.RunUntilIdle();
  EXPECT_THAT(again.GetJob(*running)->reason(),
              AllOf(HasSubstr("coordinator restarted"), Not(HasSubstr("planning it again"))));
  // New jobs get new ids.
  // Workers register again: the job is placed as attempt 2.
  for (int n : {1, 2}) {
    v1::RegisterWorkerRequest req;
    req.set_name(absl::StrCat("worker", n));
    req.set_address(Address(n));
    req.set_device("cpu");
    ASSERT_TRUE(again.RegisterWorker(req).ok());
  }
  ASSERT_TRUE(Eventually([&] { return again.GetJob(*running)->state() == v1::JOB_STATE_RUNNING; }));
  EXPECT_EQ(fresh_workers.Started(Address(1)).at(0).attempt(), 2);
  auto next = again.SubmitJob(Spec(1), "c.yaml");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, "job-3");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stagecoach::coordinator::job_manager_control_test
