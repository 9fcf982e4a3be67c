// What the end-to-end and integration tests ask of jobs and of stagectl's output: whether a job
// has ended, when it entered a state, the job id `stagectl submit` prints, and the job's history
// as text for failure messages. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::testing {

// SUCCEEDED, FAILED or CANCELLED: the job will not change any more.
bool IsFinal(const v1::Job& job);

// The last non-empty line of `text` ("" when there is none): the job id that `stagectl submit`
// and `stagectl infer` print last.
std::string LastLine(const std::string& text);

// The states the job went through, in order.
std::vector<v1::JobState> StatesOf(const v1::Job& job);

// The index in job.history() of the first transition to `state` at or after `from`, or -1.
int FindState(const v1::Job& job, v1::JobState state, int from = 0);

// When the job entered `state` the first time (the coordinator's clock); InfiniteFuture when it
// never did.
absl::Time EnteredAt(const v1::Job& job, v1::JobState state);

// "JOB_STATE_PLANNING: why | JOB_STATE_PENDING: why | ...", for failure messages.
std::string History(const v1::Job& job);

}  // namespace stagecoach::testing
