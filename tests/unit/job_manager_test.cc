// JobManager with fake workers and a fake clock: gang placement in FIFO order, step
// aggregation, lost workers, failure investigation, cancellation.
#include "coordinator/job_manager.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"
#include "coordinator/checkpoints/checkpoint_manifest.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::job_manager_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Spec(int stages, const std::string& schedule = "GPipe", int steps = 3) {
  return absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n",
                      "split: {stages: ", stages, "}\n", "schedule: {kind: ", schedule,
                      ", microbatches: 4}\n", "training: {batch_size: 8, steps: ", steps, "}\n");
}

class JobManagerTest : public JobManagerFixture {
 protected:
  v1::WorkerState WorkerState(const std::string& worker_id) {
    for (const auto& w : manager_->ListWorkers()) {
      if (w.id() == worker_id) return w.state();
    }
    return v1::WORKER_STATE_UNSPECIFIED;
  }

  absl::Status Step(const std::string& job, const std::string& worker, int rank, int step,
                    std::vector<double> losses = {}) {
    v1::ReportStepRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_step(step);
    for (double l : losses) r.add_microbatch_losses(l);
    r.set_bytes_sent(100);
    return manager_->ReportStep(r);
  }
  absl::Status End(const std::string& job, const std::string& worker, int rank,
                   v1::TaskOutcome outcome, const std::string& error = "") {
    v1::ReportTaskEndRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_outcome(outcome);
    r.set_error(error);
    return manager_->ReportTaskEnd(r);
  }
};

TEST_F(JobManagerTest, JobWaitsVisiblyUntilEnoughWorkersThenStartsEveryRank) {
  auto id = manager_->SubmitJob(Spec(2), "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(State(*id), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Job(*id).reason(), "waiting for 2 workers, 0 free");
  const std::string w1 = Register(1);
  EXPECT_EQ(Job(*id).reason(), "waiting for 2 workers, 1 free");
  EXPECT_TRUE(workers_.Started(Address(1)).empty()) << "gang: nothing starts until all can";
  const std::string w2 = Register(2);
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));

  ASSERT_EQ(workers_.Started(Address(1)).size(), 1u);
  ASSERT_EQ(workers_.Started(Address(2)).size(), 1u);
  const v1::TaskAssignment t0 = workers_.Started(Address(1))[0];
  const v1::TaskAssignment t1 = workers_.Started(Address(2))[0];
  EXPECT_EQ(t0.rank(), 0);
  EXPECT_EQ(t1.rank(), 1);
  EXPECT_EQ(t0.world_size(), 2);
  EXPECT_THAT(t0.stage_to_rank(), ElementsAre(0, 1));
  ASSERT_EQ(t0.stages_size(), 1);
  EXPECT_EQ(t0.stages(0).first_layer(), 0);
  EXPECT_EQ(t0.stages(0).end_layer(), 2);
  EXPECT_EQ(t1.stages(0).first_layer(), 2);
  EXPECT_EQ(t1.stages(0).end_layer(), 4);
  EXPECT_EQ(t0.actions(0), "0F0");
  EXPECT_EQ(t0.actions(1), "0SEND_F0");
  EXPECT_EQ(t1.actions(0), "1RECV_F0");
  EXPECT_EQ(t0.rendezvous_prefix(), t1.rendezvous_prefix());
  EXPECT_EQ(WorkerState(w1), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(WorkerState(w2), v1::WORKER_STATE_BUSY);
}

TEST_F(JobManagerTest, StepsCompleteWhenEveryRankReportedAndTheJobSucceeds) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(Spec(2, "1F1B", 2), "spec.yaml");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  ASSERT_TRUE(Step(*id, w2, 1, 0, {1.0, 2.0, 3.0, 6.0}).ok());
  EXPECT_EQ(Job(*id).steps_done(), 0) << "rank 0 has not reported step 0";
  ASSERT_TRUE(Step(*id, w1, 0, 0).ok());
  EXPECT_EQ(Job(*id).steps_done(), 1);
  EXPECT_THAT(Job(*id).losses(), ElementsAre(3.0));
  // The last stage must report one loss per microbatch; steps come in order.
  EXPECT_TRUE(absl::IsInvalidArgument(Step(*id, w2, 1, 1, {1.0})));
  EXPECT_TRUE(absl::IsInvalidArgument(Step(*id, w1, 0, 5)));
  // A report from a worker that does not hold the rank is refused.
  EXPECT_TRUE(absl::IsFailedPrecondition(Step(*id, w1, 1, 1, {1, 1, 1, 1})));
  ASSERT_TRUE(Step(*id, w1, 0, 1).ok());
  ASSERT_TRUE(Step(*id, w2, 1, 1, {0.5, 0.5, 0.5, 0.5}).ok());
  EXPECT_THAT(Job(*id).losses(), ElementsAre(3.0, 0.5));
  // Every rank holds at the job's last step until the coordinator tells it to finish.
  for (const std::string& address : {Address(1), Address(2)}) {
    ASSERT_TRUE(Eventually([&] { return !workers_.Controls(address).empty(); }));
    const v1::ControlTaskRequest finish = workers_.Controls(address).back();
    EXPECT_TRUE(finish.finish_at_limit());
    EXPECT_EQ(finish.step_limit(), 2);
  }
  EXPECT_EQ(Job(*id).ranks(0).bytes_sent(), 200);
  // Listing gives summaries: no spec, no action lists; GetJob has them.
  const v1::Job listed = manager_->ListJobs().at(0);
  EXPECT_EQ(listed.ranks(0).bytes_sent(), 200);
  EXPECT_EQ(listed.ranks(0).assigned_actions_size(), 0);
  EXPECT_TRUE(listed.spec_yaml().empty());
  EXPECT_GT(Job(*id).ranks(0).assigned_actions_size(), 0);
  EXPECT_FALSE(Job(*id).spec_yaml().empty());

  ASSERT_TRUE(End(*id, w1, 0, v1::TASK_OUTCOME_SUCCEEDED).ok());
  EXPECT_EQ(State(*id), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(End(*id, w2, 1, v1::TASK_OUTCOME_SUCCEEDED).ok());
  EXPECT_EQ(State(*id), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(WorkerState(w1), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(kv_.size(), 0u);

  auto events = manager_->WaitForEvents(*id, 0, absl::ZeroDuration());
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->ended);
  // PLANNING, PENDING, STARTING, RUNNING, 2 steps, SUCCEEDED.
  ASSERT_EQ(events->events.size(), 7u);
  EXPECT_EQ(events->events[0].state_change().state(), v1::JOB_STATE_PLANNING);
  EXPECT_EQ(events->events[2].state_change().state(), v1::JOB_STATE_STARTING);
  EXPECT_EQ(events->events[4].step_completed().loss(), 3.0);
  EXPECT_EQ(events->events[6].state_change().state(), v1::JOB_STATE_SUCCEEDED);
  for (size_t i = 0; i < events->events.size(); ++i) {
    EXPECT_EQ(events->events[i].sequence(), static_cast<int64_t>(i));
  }
}

// A worker's reporter sends a report again when its call got no answer (a partition); when the
// coordinator had taken it, the second one is the same report and counts nothing.
TEST_F(JobManagerTest, AStepReportSentAgainAfterItsAnswerWasLostCountsOnce) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(Spec(2, "1F1B", 3), "spec.yaml");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  ASSERT_TRUE(Step(*id, w2, 1, 0, {1.0, 2.0, 3.0, 6.0}).ok());
  ASSERT_TRUE(Step(*id, w2, 1, 0, {1.0, 2.0, 3.0, 6.0}).ok()) << "sent again";
  ASSERT_TRUE(Step(*id, w1, 0, 0).ok());
  ASSERT_TRUE(Step(*id, w1, 0, 0).ok()) << "sent again";
  ASSERT_TRUE(Step(*id, w2, 1, 0, {9.0, 9.0, 9.0, 9.0}).ok()) << "sent again, late";
  EXPECT_EQ(Job(*id).steps_done(), 1);
  EXPECT_THAT(Job(*id).losses(), ElementsAre(3.0));
  EXPECT_EQ(Job(*id).ranks(0).bytes_sent(), 100) << "counted twice";
  ASSERT_TRUE(Step(*id, w1, 0, 1).ok());
  ASSERT_TRUE(Step(*id, w2, 1, 1, {0.5, 0.5, 0.5, 0.5}).ok());
  EXPECT_THAT(Job(*id).losses(), ElementsAre(3.0, 0.5));
  // A step ahead of the rank's count is still refused.
  EXPECT_TRUE(absl::IsInvalidArgument(Step(*id, w1, 0, 5)));
}

TEST_F(JobManagerTest, JobsArePlacedInSubmissionOrder) {
  Register(1);
  Register(2);
  auto big = manager_->SubmitJob(Spec(3), "big.yaml");
  auto small = manager_->SubmitJob(Spec(2), "small.yaml");
  ASSERT_TRUE(big.ok() && small.ok());
  EXPECT_EQ(Job(*big).reason(), "waiting for 3 workers, 2 free");
  EXPECT_THAT(Job(*small).reason(), HasSubstr(absl::StrCat("queued behind ", *big)));
  EXPECT_EQ(State(*small), v1::JOB_STATE_PENDING);
  Register(3);
  ASSERT_TRUE(Eventually([&] { return State(*big) == v1::JOB_STATE_RUNNING; }));
  EXPECT_EQ(Job(*small).reason(), "waiting for 2 workers, 0 free");
}

TEST_F(JobManagerTest, ALostWorkerFailsItsJobNamingItAndTheOthersAreStopped) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(Spec(2), "spec.yaml");
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(Beat(w1).ok());
  // A heartbeat under w1's id from another process (another session token) is refused.
  v1::HeartbeatRequest other;
  other.set_worker_id(w1);
  other.set_session_token("0123");
  EXPECT_TRUE(absl::IsNotFound(manager_->Heartbeat(other).status()));
  clock_.Advance(absl::Seconds(2));  // w2 is now 6s without a heartbeat; the lease is 5s
  manager_->Tick();
  v1::Job job = Job(*id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("worker ", w2, " (rank 1) lost: no heartbeat")));
  EXPECT_EQ(WorkerState(w2), v1::WORKER_STATE_LOST);
  ASSERT_TRUE(Eventually([&] { return WorkerState(w1) == v1::WORKER_STATE_IDLE; }));
  EXPECT_THAT(workers_.Stopped(Address(1)), ElementsAre(*id));
  // The lost worker's heartbeat is refused so that it registers again.
  EXPECT_TRUE(absl::IsNotFound(Beat(w2)));
}

TEST_F(JobManagerTest, ARankFailureNamesALostPeerAsTheRootCause) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  auto id = manager_->SubmitJob(Spec(3), "spec.yaml");
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  workers_.SetUnreachable(Address(3));
  ASSERT_TRUE(
      End(*id, w2, 1, v1::TASK_OUTCOME_FAILED, "receive from rank 2: connection reset").ok());
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_FAILED; }));
  const std::string reason = Job(*id).reason();
  EXPECT_THAT(reason, HasSubstr(absl::StrCat("worker ", w3, " (rank 2) lost: unreachable")));
  EXPECT_THAT(reason, HasSubstr("rank 1 reported: receive from rank 2: connection reset"));
  EXPECT_EQ(WorkerState(w3), v1::WORKER_STATE_LOST);
  ASSERT_TRUE(Eventually([&] { return WorkerState(w1) == v1::WORKER_STATE_IDLE; }));
  EXPECT_EQ(WorkerState(w2), v1::WORKER_STATE_IDLE);
}

TEST_F(JobManagerTest, ARankFailureWithHealthyPeersIsTheRootCause) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(Spec(2), "spec.yaml");
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  ASSERT_TRUE(End(*id, w2, 1, v1::TASK_OUTCOME_FAILED, "rank 1, action 1F0: boom").ok());
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_FAILED; }));
  EXPECT_EQ(Job(*id).reason(),
            absl::StrCat("rank 1 (worker ", w2, ") failed: rank 1, action 1F0: boom"));
  ASSERT_TRUE(Eventually([&] { return !workers_.Stopped(Address(1)).empty(); }));
  EXPECT_TRUE(workers_.Stopped(Address(2)).empty()) << "rank 1 already ended";
}

TEST_F(JobManagerTest, CancelStopsEveryRankAndFreesTheWorkers) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(Spec(2), "spec.yaml");
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_RUNNING; }));
  auto cancelled = manager_->CancelJob(*id, "");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->reason(), "cancelled by client");
  ASSERT_TRUE(Eventually([&] {
    return WorkerState(w1) == v1::WORKER_STATE_IDLE && WorkerState(w2) == v1::WORKER_STATE_IDLE;
  }));
  EXPECT_THAT(workers_.Stopped(Address(1)), ElementsAre(*id));
  EXPECT_THAT(workers_.Stopped(Address(2)), ElementsAre(*id));
  EXPECT_TRUE(absl::IsFailedPrecondition(manager_->CancelJob(*id, "").status()));
  // A pending job can be cancelled too.
  auto pending = manager_->SubmitJob(Spec(4), "spec.yaml");
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(manager_->CancelJob(*pending, "not needed")->reason(), "not needed");
}

TEST_F(JobManagerTest, AWorkerThatCannotBeStartedFailsTheJobAndIsMarkedLost) {
  const std::string w1 = Register(1), w2 = Register(2);
  workers_.SetUnreachable(Address(2));
  auto id = manager_->SubmitJob(Spec(2), "spec.yaml");
  ASSERT_TRUE(Eventually([&] { return State(*id) == v1::JOB_STATE_FAILED; }));
  EXPECT_THAT(Job(*id).reason(), HasSubstr(absl::StrCat("could not start rank 1 on worker ", w2)));
  EXPECT_EQ(WorkerState(w2), v1::WORKER_STATE_LOST);
  ASSERT_TRUE(Eventually([&] { return WorkerState(w1) == v1::WORKER_STATE_IDLE; }));
}

TEST_F(JobManagerTest, InvalidSpecsAreRefusedAndNothingIsQueued) {
  auto bad = manager_->SubmitJob("name: x\n", "bad.yaml");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  auto too_many = manager_->SubmitJob(Spec(5), "many.yaml");
  ASSERT_TRUE(absl::IsInvalidArgument(too_many.status()));
  EXPECT_THAT(std::string(too_many.status().message()), HasSubstr("split.stages: must be <= 4"));
  EXPECT_TRUE(manager_->ListJobs().empty());
  EXPECT_TRUE(absl::IsNotFound(manager_->GetJob("job-9").status()));
}

TEST_F(JobManagerTest, RegistrationNeedsAnAddressAndOneDaemonPerAddress) {
  v1::RegisterWorkerRequest req;
  req.set_device("cpu");
  EXPECT_TRUE(absl::IsInvalidArgument(manager_->RegisterWorker(req).status()));
  Register(1);
  req.set_address(Address(1));
  EXPECT_TRUE(absl::IsAlreadyExists(manager_->RegisterWorker(req).status()));
}

}  // namespace
}  // namespace stagecoach::coordinator::job_manager_test
