// What the benchmarks that run real daemons (tests/support/local_cluster.h) share: a job run to
// its end.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::bench {

inline bool Finished(const v1::Job& job) {
  return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
         job.state() == v1::JOB_STATE_CANCELLED;
}

// Submits `spec` and waits up to `timeout` for the job to end: the finished job, or Fail naming
// `what`, how the job ended and the daemons' logs unless it succeeded.
inline v1::Job RunJob(testing::LocalCluster& cluster, const std::string& spec,
                      absl::Duration timeout, const std::string& what) {
  const std::string id = Value("submitting " + what, cluster.Submit(spec));
  const v1::Job job = Value(what + " (" + id + ")", cluster.WaitForJob(id, Finished, timeout));
  if (job.state() != v1::JOB_STATE_SUCCEEDED) {
    Fail(what + " (" + id + ")",
         absl::InternalError(absl::StrCat("ended ", v1::JobState_Name(job.state()), ": ",
                                          job.reason(), "\n", cluster.Logs())));
  }
  return job;
}

}  // namespace stagecoach::bench
