// What the benchmarks that run real daemons (tests/support/local_cluster.h) share: a job run to
// its end, and its steps as `stagectl watch -o json` reports them.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "nlohmann/json.hpp"
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

// The step events of the job `id` (the lines of `stagectl watch -o json` with
// step_time_seconds, from its event log), the first `skip` left out; Fail when none is left.
inline std::vector<nlohmann::json> StepEvents(testing::LocalCluster& cluster, const std::string& id,
                                              int skip = 0) {
  testing::CommandResult watch = cluster.Stagectl({"watch", id, "-o", "json"});
  std::vector<nlohmann::json> steps;
  int step = 0;
  for (absl::string_view line : absl::StrSplit(watch.out, '\n')) {
    nlohmann::json event = nlohmann::json::parse(line, nullptr, false);
    if (!event.is_object() || !event.contains("step_time_seconds")) continue;
    if (step++ >= skip) steps.push_back(std::move(event));
  }
  if (steps.empty()) {
    Fail("watch " + id, absl::InternalError(absl::StrCat("no step events after the first ", skip)));
  }
  return steps;
}

}  // namespace stagecoach::bench
