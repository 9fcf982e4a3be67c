// What plans hold in the coordinator (coordinator/jobs/plan_memory.h): an ended job's action
// lists are released when they are large (its schedule then says so, its status stays) and kept
// when small; admission refuses a job whose plan would take the live jobs' plans over
// --max-plan-memory, naming the bound, and makes room by releasing ended jobs' lists.
#include "coordinator/jobs/plan_memory.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/hf_model_spec.h"
#include "coordinator/job_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::plan_memory_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Spec(int stages, int microbatches) {
  return absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n",
                      "split: {stages: ", stages, "}\nschedule: {kind: 1F1B, microbatches: ",
                      microbatches, "}\ntraining: {batch_size: ", microbatches, ", steps: 3}\n");
}

// The bytes PlanMemoryBytes gives the plan of `spec_yaml`, planned as admission plans it.
int64_t PlanBytes(const std::string& spec_yaml) {
  auto spec = spec::ReadJobSpec(spec_yaml, "spec");
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = PlanJob(*spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? PlanMemoryBytes(*plan) : 0;
}

TEST(PlanMemoryBytes, GrowsWithTheActions) {
  const int64_t small = PlanBytes(Spec(4, 4));
  const int64_t large = PlanBytes(Spec(4, 64));
  EXPECT_GT(small, 0);
  // 1F1B on 4 ranks: F, B and their sends and receives per microbatch and stage, ~16 times more.
  EXPECT_GT(large, 12 * small);
  EXPECT_LT(large, 17 * small);
}

using PlanMemoryTest = JobManagerFixture;

TEST_F(PlanMemoryTest, AnEndedJobReleasesLargeActionListsAndKeepsSmallOnes) {
  Register(1);
  Register(2);
  // 2 ranks x 8,192 microbatches: about 65,000 actions, over kKeptPlanBytes.
  const std::string large = Spec(2, 8192);
  ASSERT_GT(PlanBytes(large), kKeptPlanBytes);
  auto id = manager_->SubmitJob(large, "spec.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return manager_->GetJob(*id)->state() == v1::JOB_STATE_RUNNING; }));
  ASSERT_TRUE(manager_->GetJobSchedule(*id).ok());
  EXPECT_GT(manager_->GetJob(*id)->ranks(0).assigned_actions_size(), 0);

  ASSERT_TRUE(manager_->CancelJob(*id, "").ok());
  auto schedule = manager_->GetJobSchedule(*id);
  ASSERT_TRUE(absl::IsFailedPrecondition(schedule.status())) << schedule.status();
  EXPECT_THAT(std::string(schedule.status().message()),
              HasSubstr("is CANCELLED: a job's action lists are released when it ends (and "
                        "not kept on disk); "
                        "`stagectl schedule --kind 1F1B --ranks 2 --microbatches 8192`"));
  auto job = manager_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job->stages_size(), 2);
  ASSERT_EQ(job->ranks_size(), 2);
  EXPECT_EQ(job->ranks(0).assigned_actions_size(), 0);

  // A small job keeps its lists after it ends.
  ASSERT_TRUE(Eventually([&] {
    for (const v1::WorkerInfo& w : manager_->ListWorkers()) {
      if (w.state() != v1::WORKER_STATE_IDLE) return false;
    }
    return true;
  }));
  auto small = manager_->SubmitJob(Spec(2, 4), "spec.yaml");
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(
      Eventually([&] { return manager_->GetJob(*small)->state() == v1::JOB_STATE_RUNNING; }));
  ASSERT_TRUE(manager_->CancelJob(*small, "").ok());
  EXPECT_TRUE(manager_->GetJobSchedule(*small).ok());
  EXPECT_GT(manager_->GetJob(*small)->ranks(0).assigned_actions_size(), 0);
}

TEST_F(PlanMemoryTest, AdmissionBoundsTheLivePlansAndNamesTheFlag) {
  const std::string spec = Spec(4, 32);
  const int64_t one = PlanBytes(spec);
  JobManagerOptions options;
  options.lease = absl::Seconds(5);
  options.heartbeat_interval = absl::Seconds(1);
  options.max_plan_memory_bytes = one + one / 2;
  manager_ = std::make_unique<JobManager>(options, Deps());

  auto first = manager_->SubmitJob(spec, "spec.yaml");  // no workers: it waits, PENDING
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = manager_->SubmitJob(spec, "spec.yaml");
  ASSERT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              AllOf(HasSubstr("the plans of 1 live job hold about"),
                    HasSubstr("for all plans (--max-plan-memory)")));
  EXPECT_EQ(manager_->ListJobs().size(), 1u) << "nothing queued";

  // Ended, the first job's lists (small: kept) still count, but are released to make room.
  ASSERT_TRUE(manager_->CancelJob(*first, "").ok());
  EXPECT_TRUE(manager_->GetJobSchedule(*first).ok());
  auto third = manager_->SubmitJob(spec, "spec.yaml");
  EXPECT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(manager_->GetJobSchedule(*first).status()));
}

}  // namespace
}  // namespace stagecoach::coordinator::plan_memory_test
