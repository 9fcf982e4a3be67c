// GetJobSchedule's view of a plan (see schedule_view.h).
#include "coordinator/planning/schedule_view.h"

#include <algorithm>
#include <string>

#include "common/schedule/action.h"
#include "common/schedule/validator.h"

namespace stagecoach::coordinator {

v1::GetJobScheduleResponse ScheduleView(const Plan& plan) {
  v1::GetJobScheduleResponse out;
  out.set_schedule(plan.schedule_name);
  out.set_num_stages(plan.num_stages);
  out.set_num_ranks(plan.num_ranks);
  out.set_microbatches(plan.num_microbatches);

  // One row per rank of the plan, or of the lowered lists if they have more (they should not).
  const size_t num_ranks =
      std::max(static_cast<size_t>(std::max(plan.num_ranks, 0)), plan.lowered.size());
  schedule::PipelineOrder compute(num_ranks);
  schedule::PipelineOrder lowered(num_ranks);
  for (size_t r = 0; r < num_ranks; ++r) {
    v1::RankSchedule* rank = out.add_ranks();
    rank->set_rank(static_cast<int>(r));
    for (size_t s = 0; s < plan.stage_to_rank.size(); ++s) {
      if (plan.stage_to_rank[s] == static_cast<int>(r)) rank->add_stages(static_cast<int>(s));
    }
    if (r >= plan.lowered.size()) continue;
    for (const auto& action : plan.lowered[r]) {
      if (!action.has_value()) continue;
      const std::string text = action->ToString();
      rank->add_lowered_actions(text);
      lowered[r].push_back(*action);
      if (schedule::IsCompute(action->type)) {
        rank->add_compute_actions(text);
        compute[r].push_back(*action);
      }
    }
  }
  out.set_grid(schedule::FormatGrid(compute));
  out.set_lowered_grid(schedule::FormatGrid(lowered));
  return out;
}

}  // namespace stagecoach::coordinator
