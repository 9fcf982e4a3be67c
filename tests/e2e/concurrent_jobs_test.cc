// Several jobs at once on one coordinator: jobs run side by side on disjoint workers, each with
// its own rendezvous, and train exactly as they would alone; a job needing more workers than
// are free waits (gang semantics) and starts once enough are released.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::testing::concurrent_jobs_test {
namespace {

using ::testing::HasSubstr;

std::string MlpSpec(const std::string& name, int stages, int64_t steps) {
  return absl::StrCat("name: ", name, "\n",
                      "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 16, 16, 4], seed: 1}\n",
                      "split: {stages: ", stages, "}\nschedule: {kind: 1F1B, microbatches: 4}\n",
                      "training: {batch_size: 16, steps: ", steps, ", loss: mse}\n");
}

TEST(ConcurrentJobs, TwoJobsRunSideBySideOnDisjointWorkersAndAThirdWaitsForItsGang) {
  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForIdleWorkers(4, absl::Seconds(30)).ok()) << c.Logs();

  // Two identical 2-stage jobs: 4 workers hold both at once.
  std::vector<std::string> ids;
  for (const char* name : {"left", "right"}) {
    const std::string spec = c.WriteFile(absl::StrCat(name, ".yaml"), MlpSpec(name, 2, 60));
    CommandResult submit = c.Stagectl({"submit", spec});
    ASSERT_EQ(submit.exit_code, 0) << submit.err;
    ids.push_back(LastLine(submit.out));
  }
  // A 3-stage job cannot start while they hold all 4 workers.
  const std::string wide_spec = c.WriteFile("wide.yaml", MlpSpec("wide", 3, 5));
  CommandResult submit = c.Stagectl({"submit", wide_spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string wide = LastLine(submit.out);
  auto waiting = c.GetJob(wide);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  if (waiting->state() == v1::JOB_STATE_PENDING) {
    EXPECT_THAT(waiting->reason(), HasSubstr("waiting for 3 workers"));
  }

  std::vector<v1::Job> done;
  for (const std::string& id : ids) {
    auto job = c.WaitForJob(id, IsFinal, absl::Seconds(120));
    ASSERT_TRUE(job.ok()) << job.status() << c.Logs();
    ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << c.Logs();
    done.push_back(*job);
  }
  // Disjoint workers, and the two ran at the same time.
  std::set<std::string> workers;
  for (const v1::Job& job : done) {
    for (const auto& rank : job.ranks()) {
      EXPECT_TRUE(workers.insert(rank.worker_id()).second)
          << rank.worker_id() << " ran ranks of both jobs";
    }
  }
  EXPECT_EQ(workers.size(), 4u);
  EXPECT_LT(EnteredAt(done[0], v1::JOB_STATE_RUNNING), EnteredAt(done[1], v1::JOB_STATE_SUCCEEDED));
  EXPECT_LT(EnteredAt(done[1], v1::JOB_STATE_RUNNING), EnteredAt(done[0], v1::JOB_STATE_SUCCEEDED));
  // Same spec, same numbers: neither job saw the other's messages.
  ASSERT_EQ(done[0].losses_size(), 60);
  for (int i = 0; i < done[0].losses_size(); ++i) {
    EXPECT_EQ(done[0].losses(i), done[1].losses(i)) << "step " << i;
  }

  // Gang semantics at both ends: a job's workers come free together when it ends, and the wide
  // job (3 workers) needs workers of both jobs (2 of 4 each), so it started only after the
  // later of the two finished, not the earlier.
  auto wide_done = c.WaitForJob(wide, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(wide_done.ok()) << wide_done.status() << c.Logs();
  EXPECT_EQ(wide_done->state(), v1::JOB_STATE_SUCCEEDED) << wide_done->reason();
  const absl::Time both_free = std::max(EnteredAt(done[0], v1::JOB_STATE_SUCCEEDED),
                                        EnteredAt(done[1], v1::JOB_STATE_SUCCEEDED));
  EXPECT_GE(EnteredAt(*wide_done, v1::JOB_STATE_STARTING), both_free);
}

}  // namespace
}  // namespace stagecoach::testing::concurrent_jobs_test
