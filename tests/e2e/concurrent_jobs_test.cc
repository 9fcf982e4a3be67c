// Several jobs at once on one coordinator: jobs run side by side on disjoint workers, each with
// its own rendezvous, and train exactly as they would alone; a job needing more workers than
// are free waits (gang semantics) and starts once enough are released.
#include <set>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::testing {
namespace {

using ::testing::HasSubstr;

std::string MlpSpec(const std::string& name, int stages, int64_t steps) {
  return absl::StrCat("name: ", name, "\n",
                      "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 16, 16, 4], seed: 1}\n",
                      "split: {stages: ", stages, "}\nschedule: {kind: 1F1B, microbatches: 4}\n",
                      "training: {batch_size: 16, steps: ", steps, ", loss: mse}\n");
}

std::string LastLine(const std::string& text) {
  std::string line;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) line = text.substr(start, end - start);
    start = end + 1;
  }
  return line;
}

bool Final(const v1::Job& j) {
  return j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED ||
         j.state() == v1::JOB_STATE_CANCELLED;
}

// When the job entered `state` (the first time).
absl::Time Entered(const v1::Job& job, v1::JobState state) {
  for (const auto& t : job.history()) {
    if (t.state() == state) return rpc::FromProtoTimestamp(t.time());
  }
  return absl::InfiniteFuture();
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
    auto job = c.WaitForJob(id, Final, absl::Seconds(120));
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
  EXPECT_LT(Entered(done[0], v1::JOB_STATE_RUNNING), Entered(done[1], v1::JOB_STATE_SUCCEEDED));
  EXPECT_LT(Entered(done[1], v1::JOB_STATE_RUNNING), Entered(done[0], v1::JOB_STATE_SUCCEEDED));
  // Same spec, same numbers: neither job saw the other's messages.
  ASSERT_EQ(done[0].losses_size(), 60);
  for (int i = 0; i < done[0].losses_size(); ++i) {
    EXPECT_EQ(done[0].losses(i), done[1].losses(i)) << "step " << i;
  }

  // The wide job started only after both had released their workers, and succeeded.
  auto wide_done = c.WaitForJob(wide, Final, absl::Seconds(120));
  ASSERT_TRUE(wide_done.ok()) << wide_done.status() << c.Logs();
  EXPECT_EQ(wide_done->state(), v1::JOB_STATE_SUCCEEDED) << wide_done->reason();
  const absl::Time first_free = std::min(Entered(done[0], v1::JOB_STATE_SUCCEEDED),
                                         Entered(done[1], v1::JOB_STATE_SUCCEEDED));
  EXPECT_GE(Entered(*wide_done, v1::JOB_STATE_STARTING), first_free);
}

}  // namespace
}  // namespace stagecoach::testing
