#include "tests/support/resumed_legs.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/layout.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"

namespace stagecoach::testing {

void RunResumedLegs(LocalCluster& cluster, const std::string& name, int legs, int64_t steps,
                    const std::function<std::string(int leg, const std::string& ckpt,
                                                    const std::string& resume_from)>& spec,
                    ResumedLegs* out) {
  std::string resume_from;
  for (int i = 0; i < legs; ++i) {
    SCOPED_TRACE(absl::StrCat(name, " leg ", i));
    const std::string ckpt = absl::StrCat(cluster.dir(), "/", name, "-", i);
    const std::string file =
        cluster.WriteFile(absl::StrCat(name, "-", i, ".yaml"), spec(i, ckpt, resume_from));
    CommandResult submit = cluster.Stagectl({"submit", file, "--wait"});
    ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << cluster.Logs();
    auto job = cluster.GetJob(LastLine(submit.out));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << cluster.Logs();
    ASSERT_EQ(job->losses_size(), steps);
    out->losses.insert(out->losses.end(), job->losses().begin(), job->losses().end());
    resume_from = checkpoint::CheckpointStepDirectory(ckpt, steps * (i + 1));
    out->last_checkpoint_dir = ckpt;
  }
}

void ExpectLossesNear(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                      double atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t step = 0; step < got.size(); ++step) {
    EXPECT_NEAR(got[step], want[step], atol + rtol * std::abs(want[step])) << "step " << step;
  }
}

}  // namespace stagecoach::testing
