#include "coordinator/jobs/plan_memory.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/schedule/action.h"
#include "common/util/byte_size.h"
#include "coordinator/jobs/job.h"

namespace stagecoach::coordinator {

int64_t PlanMemoryBytes(const Plan& plan) {
  int64_t actions = 0;
  int64_t nested = 0;
  for (const schedule::RankActions& rank : plan.lowered) {
    actions += static_cast<int64_t>(rank.size());
    for (const std::optional<schedule::Action>& a : rank) {
      if (a.has_value()) nested += static_cast<int64_t>(a->sub_actions.size());
    }
  }
  // Vectors grown by doubling and the allocator's own headers add about a third to the
  // elements' sizes: bench/plan_memory_bench measured 192.8 MiB of heap for an unplaced plan of
  // 3.0 million actions (67 bytes an action for the lowered lists alone, 48 of them the element).
  constexpr int64_t kPerAction =
      (sizeof(std::optional<schedule::Action>) + sizeof(std::string)) * 4 / 3;
  return actions * kPerAction + nested * static_cast<int64_t>(sizeof(schedule::Action));
}

absl::Status MakeRoomForPlan(int64_t plan_bytes, const std::vector<Job*>& jobs, int64_t limit) {
  if (limit <= 0) return absl::OkStatus();
  int64_t live_bytes = 0;
  int live = 0;
  std::vector<std::pair<absl::Time, Job*>> ended;  // holding lists, by when they ended
  int64_t ended_bytes = 0;
  for (Job* job : jobs) {
    const int64_t bytes = PlanMemoryBytes(job->plan);
    if (!IsFinal(job->state)) {
      live_bytes += bytes;
      ++live;
    } else if (bytes > 0) {
      ended.emplace_back(job->FinishedTime().value_or(absl::InfinitePast()), job);
      ended_bytes += bytes;
    }
  }
  if (live_bytes + plan_bytes > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job's plan would hold about ", util::FormatBytes(plan_bytes),
        " (its action lists), and the plans of ", live, " live job", live == 1 ? "" : "s",
        " hold about ", util::FormatBytes(live_bytes), ": together over the coordinator's bound of ",
        util::FormatBytes(limit),
        " for all plans (--max-plan-memory); wait for jobs to end or cancel some, use fewer "
        "stages or microbatches, or raise --max-plan-memory"));
  }
  std::sort(ended.begin(), ended.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [when, job] : ended) {
    if (live_bytes + ended_bytes + plan_bytes <= limit) break;
    ended_bytes -= PlanMemoryBytes(job->plan);
    job->ReleaseActionLists();
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::coordinator
