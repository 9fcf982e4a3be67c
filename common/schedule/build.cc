#include "common/schedule/build.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule {

absl::StatusOr<BuiltSchedule> BuildSchedule(const ScheduleConfig& config,
                                            const LoweringOptions& lowering) {
  BuiltSchedule built;
  ASSIGN_OR_RETURN(built.compute, GenerateSchedule(config));
  const int num_stages = NumStages(config);
  const int m = config.num_microbatches;
  ASSIGN_OR_RETURN(built.stage_to_rank,
                   StageToRank(num_stages, config.num_ranks, DefaultMappingStyle(config.kind)));
  ValidationOptions validation;
  validation.has_backward = HasBackward(config.kind);
  // The pass's UNSHARDs and RESHARDs pair up and surround every compute action.
  ValidationOptions lowered_validation = validation;
  lowered_validation.sharded_parameters = lowering.max_active_stages > 0;
  auto bug = [&](const absl::Status& status) {
    return absl::InternalError(absl::StrCat("the generated ", ScheduleKindName(config.kind),
                                            " schedule is invalid: ", status.message()));
  };
  auto inferred =
      ValidateComputeSchedule(built.compute, config.num_ranks, num_stages, m, validation);
  if (!inferred.ok()) return bug(inferred.status());
  auto lowered = LowerSchedule(built.compute, built.stage_to_rank, num_stages, m, lowering);
  if (!lowered.ok()) return bug(lowered.status());
  built.lowered = *std::move(lowered);
  absl::Status valid = ValidateLoweredSchedule(built.lowered, built.stage_to_rank, num_stages, m,
                                               lowered_validation);
  if (!valid.ok()) return bug(valid);
  return built;
}

}  // namespace stagecoach::schedule
