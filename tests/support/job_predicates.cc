#include "tests/support/job_predicates.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/time_conversion.h"

namespace stagecoach::testing {

bool IsFinal(const v1::Job& job) {
  return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
         job.state() == v1::JOB_STATE_CANCELLED;
}

std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines.empty() ? "" : lines.back();
}

std::vector<v1::JobState> StatesOf(const v1::Job& job) {
  std::vector<v1::JobState> states;
  for (const v1::JobTransition& t : job.history()) states.push_back(t.state());
  return states;
}

int FindState(const v1::Job& job, v1::JobState state, int from) {
  for (int i = from; i < job.history_size(); ++i) {
    if (job.history(i).state() == state) return i;
  }
  return -1;
}

absl::Time EnteredAt(const v1::Job& job, v1::JobState state) {
  const int i = FindState(job, state);
  return i < 0 ? absl::InfiniteFuture() : rpc::FromProtoTimestamp(job.history(i).time());
}

std::string History(const v1::Job& job) {
  std::string out;
  for (const v1::JobTransition& t : job.history()) {
    absl::StrAppend(&out, out.empty() ? "" : " | ", v1::JobState_Name(t.state()), ": ", t.reason());
  }
  return out;
}

}  // namespace stagecoach::testing
