#include "tests/support/step_zero.h"

#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"

namespace stagecoach::testing {

void HoldAtAStepZeroCheckpoint(LocalCluster& cl, const std::string& spec, std::string* out_id) {
  // Held before its first step: a checkpoint there is the initial parameters.
  CommandResult submit = cl.Stagectl({"submit", spec, "--paused"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const std::string id = LastLine(submit.out);
  *out_id = id;
  auto paused = cl.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.state() == v1::JOB_STATE_PAUSED; },
      absl::Seconds(120));
  ASSERT_TRUE(paused.ok()) << paused.status() << cl.Logs();
  ASSERT_EQ(paused->state(), v1::JOB_STATE_PAUSED) << paused->reason();
  CommandResult checkpoint = cl.Stagectl({"checkpoint", id});
  if (checkpoint.exit_code != 0) {
    // The job may have failed once paused (a worker opening its data): say why.
    auto now = cl.WaitForJob(id, IsFinal, absl::Seconds(10));
    FAIL() << checkpoint.out << checkpoint.err
           << (now.ok() ? absl::StrCat("the job: ", now->reason()) : now.status().ToString())
           << cl.Logs();
  }
  auto at_zero = cl.WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.checkpoints_size() > 0; },
      absl::Seconds(60));
  ASSERT_TRUE(at_zero.ok()) << at_zero.status();
  ASSERT_GT(at_zero->checkpoints_size(), 0);
  ASSERT_EQ(at_zero->checkpoints(0).step(), 0);
}

void RunFromAStepZeroCheckpoint(LocalCluster& cl, const std::string& spec, v1::Job* out) {
  std::string id;
  ASSERT_NO_FATAL_FAILURE(HoldAtAStepZeroCheckpoint(cl, spec, &id));
  CommandResult resume = cl.Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.out << resume.err;
  auto done = cl.WaitForJob(id, IsFinal, absl::Seconds(180));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << cl.Logs();
  *out = *done;
}

}  // namespace stagecoach::testing
