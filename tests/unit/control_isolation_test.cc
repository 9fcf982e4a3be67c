// Step control is serialised per job: with one job's client step stuck on a frozen worker,
// another job's pause and status go on; and a stuck job-table disk delays neither heartbeats,
// status nor submissions. Proved with latches: a call that were blocked would hang the test.
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "coordinator/job_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::control_isolation_test {
namespace {

std::string Spec(int steps, const std::string& extra = "") { return TwoStageSpec(steps, extra); }

v1::TensorData Floats(int64_t rows, int64_t cols) { return ZeroFloats(rows, cols); }

class ControlIsolationTest : public JobManagerFixture {
 protected:
  v1::JobState State(const std::string& id) {
    Settle();
    return manager_->GetJob(id)->state();
  }
};

TEST_F(ControlIsolationTest, AJobStuckOnAFrozenWorkerDoesNotDelayAnotherJobsControl) {
  Register(1);
  Register(2);
  auto a = manager_->SubmitJob(Spec(5), "a.yaml", /*start_paused=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(State(*a), v1::JOB_STATE_PAUSED);
  Register(3);
  Register(4);
  auto b = manager_->SubmitJob(Spec(5), "b.yaml");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(State(*b), v1::JOB_STATE_RUNNING);

  // A's rank 0 worker freezes: its ControlTask does not return until released.
  absl::Notification arrived, release;
  workers_.SetControlAnswer(
      Address(1), [&](const v1::ControlTaskRequest&) -> absl::StatusOr<v1::ControlTaskResponse> {
        arrived.Notify();
        release.WaitForNotification();
        return absl::UnavailableError("the worker was frozen");
      });
  v1::StepJobRequest step;
  step.set_job_id(*a);
  *step.mutable_inputs() = Floats(8, 4);
  *step.mutable_targets() = Floats(8, 2);
  absl::StatusOr<v1::StepJobResponse> stepped = absl::UnknownError("not returned");
  std::thread client([&] { stepped = manager_->StepJob(step, absl::Hours(1)); });
  arrived.WaitForNotification();  // A's client step holds A's control lock, waiting on w-1

  // B's control and status answer meanwhile (were they serialised with A's, this would hang).
  auto paused = manager_->PauseJob(*b);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->global_step(), 1);
  auto status = manager_->GetJob(*b);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->pause_at_global_step(), 1);
  EXPECT_EQ(manager_->ListJobs().size(), 2u);
  EXPECT_FALSE(stepped.ok()) << "A's step is still stuck";

  release.Notify();
  client.join();
  EXPECT_TRUE(absl::IsUnavailable(stepped.status())) << stepped.status();
  EXPECT_THAT(std::string(stepped.status().message()), ::testing::HasSubstr("rank 0"));
  EXPECT_EQ(State(*a), v1::JOB_STATE_FAILED) << "no restart allowed: the control failure ends it";
  EXPECT_EQ(manager_->GetJob(*a)->failure().rank(), 0);
}

TEST_F(ControlIsolationTest, AStuckJobTableDiskDelaysNeitherHeartbeatsNorReports) {
  MemoryJobStore store;
  absl::Notification release;
  store.BlockSaves(&release);
  JobManagerOptions options;
  options.lease = absl::Seconds(5);
  options.heartbeat_interval = absl::Seconds(1);
  manager_ = std::make_unique<JobManager>(options, Deps(&store));
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(Spec(3), "a.yaml");
  ASSERT_TRUE(id.ok());
  // The disk writes run on their own thread and get stuck in the store.
  std::thread disk([&] { executor_.RunUntilIdle(); });
  store.entered().WaitForNotification();

  // Heartbeats, leases, status and new jobs go on without the disk.
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(Beat(w1).ok());
  ASSERT_TRUE(Beat(w2).ok());
  clock_.Advance(absl::Seconds(4));
  manager_->Tick();  // leases were renewed: nobody is lost
  for (const auto& w : manager_->ListWorkers()) EXPECT_NE(w.state(), v1::WORKER_STATE_LOST);
  auto again = manager_->SubmitJob(Spec(3), "b.yaml");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(manager_->GetJob(*again)->state(), v1::JOB_STATE_PENDING);
  EXPECT_TRUE(store.calls().empty()) << "nothing has reached the stuck disk yet";

  release.Notify();
  disk.join();
  Settle();
  EXPECT_EQ(store.ids().count(*id), 1u);
  EXPECT_EQ(store.ids().count(*again), 1u);
}

}  // namespace
}  // namespace stagecoach::coordinator::control_isolation_test
