#include "common/schedule/generators.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/lowering.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule {
namespace {

absl::Status CheckConfig(const ScheduleConfig& config) {
  if (config.num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_ranks must be at least 1, got ", config.num_ranks));
  }
  if (config.stages_per_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages_per_rank must be at least 1, got ", config.stages_per_rank));
  }
  if (config.num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_microbatches must be at least 1, got ", config.num_microbatches));
  }
  return absl::OkStatus();
}

absl::Status CheckSingleStage(const ScheduleConfig& config) {
  if (config.stages_per_rank != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        ScheduleKindName(config.kind), " runs exactly one stage per rank, but stages_per_rank is ",
        config.stages_per_rank));
  }
  return absl::OkStatus();
}

void AppendIdle(RankActions& actions, int count) {
  for (int i = 0; i < count; ++i) actions.push_back(std::nullopt);
}

// Rank r: r idle slots, F0..F(m-1), 3*(pp-1-r) idle slots, B0..B(m-1).
PipelineOrder GPipeTimeAligned(int num_ranks, int num_microbatches) {
  PipelineOrder order(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    RankActions& actions = order[rank];
    AppendIdle(actions, rank);
    for (int mb = 0; mb < num_microbatches; ++mb) {
      actions.push_back(Action::Make(rank, ActionType::kForward, mb));
    }
    AppendIdle(actions, 3 * (num_ranks - 1 - rank));
    for (int mb = 0; mb < num_microbatches; ++mb) {
      actions.push_back(Action::Make(rank, ActionType::kFullBackward, mb));
    }
  }
  return order;
}

// Rank r: r idle slots; w = pp-1-r warm-up forwards; 2w idle slots; m-w (F, B) pairs; then
// (idle, B) for the w backwards left. Forwards and backwards each count microbatches from 0 on
// every rank (PyTorch's last rank starts its forwards at 1; see ScheduleKind::k1F1B).
PipelineOrder OneFOneBTimeAligned(int num_ranks, int num_microbatches) {
  PipelineOrder order(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    RankActions& actions = order[rank];
    const int warmup = num_ranks - 1 - rank;
    int next_forward = 0;
    int next_backward = 0;
    AppendIdle(actions, rank);
    for (; next_forward < warmup; ++next_forward) {
      actions.push_back(Action::Make(rank, ActionType::kForward, next_forward));
    }
    AppendIdle(actions, 2 * warmup);
    while (next_forward < num_microbatches) {
      actions.push_back(Action::Make(rank, ActionType::kForward, next_forward++));
      actions.push_back(Action::Make(rank, ActionType::kFullBackward, next_backward++));
    }
    while (next_backward < num_microbatches) {
      actions.push_back(std::nullopt);
      actions.push_back(Action::Make(rank, ActionType::kFullBackward, next_backward++));
    }
  }
  return order;
}

absl::Status InvalidStyleInputs(int num_stages, int num_ranks) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages must be at least 1, got ", num_stages));
  }
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_ranks must be at least 1, got ", num_ranks));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  std::vector<absl::string_view> names;
  for (ScheduleKind kind : AllScheduleKinds()) {
    if (absl::EqualsIgnoreCase(name, ScheduleKindName(kind))) return kind;
    names.push_back(ScheduleKindName(kind));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", name, "'; valid schedules: ", absl::StrJoin(names, ", ")));
}

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "GPipe";
    case ScheduleKind::k1F1B:
      return "1F1B";
  }
  return "?";
}

const std::vector<ScheduleKind>& AllScheduleKinds() {
  static const auto* kinds =
      new std::vector<ScheduleKind>{ScheduleKind::kGPipe, ScheduleKind::k1F1B};
  return *kinds;
}

int NumStages(const ScheduleConfig& config) { return config.num_ranks * config.stages_per_rank; }

absl::StatusOr<PipelineOrder> GenerateTimeAligned(const ScheduleConfig& config) {
  RETURN_IF_ERROR(CheckConfig(config));
  switch (config.kind) {
    case ScheduleKind::kGPipe:
      RETURN_IF_ERROR(CheckSingleStage(config));
      return GPipeTimeAligned(config.num_ranks, config.num_microbatches);
    case ScheduleKind::k1F1B: {
      RETURN_IF_ERROR(CheckSingleStage(config));
      const int num_stages = NumStages(config);
      if (config.num_microbatches < num_stages) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Number of microbatches (", config.num_microbatches,
            ") must be greater than or equal to the number of stages (", num_stages, ")."));
      }
      return OneFOneBTimeAligned(config.num_ranks, config.num_microbatches);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule kind ", static_cast<int>(config.kind)));
}

absl::StatusOr<PipelineOrder> GenerateSchedule(const ScheduleConfig& config) {
  ASSIGN_OR_RETURN(PipelineOrder order, GenerateTimeAligned(config));
  switch (config.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
      for (RankActions& actions : order) {
        actions = AddReduceGrad(actions, config.num_microbatches);
      }
      break;
  }
  return order;
}

absl::StatusOr<MappingStyle> ParseMappingStyle(absl::string_view name) {
  for (MappingStyle style : {MappingStyle::kLoop, MappingStyle::kV}) {
    if (absl::EqualsIgnoreCase(name, MappingStyleName(style))) return style;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown stage-to-rank mapping style '", name, "'; valid styles: loop, v"));
}

absl::string_view MappingStyleName(MappingStyle style) {
  switch (style) {
    case MappingStyle::kLoop:
      return "loop";
    case MappingStyle::kV:
      return "v";
  }
  return "?";
}

absl::StatusOr<std::vector<int>> StageToRank(int num_stages, int num_ranks, MappingStyle style) {
  RETURN_IF_ERROR(InvalidStyleInputs(num_stages, num_ranks));
  std::vector<int> stage_to_rank(num_stages);
  switch (style) {
    case MappingStyle::kLoop:
      for (int stage = 0; stage < num_stages; ++stage) stage_to_rank[stage] = stage % num_ranks;
      break;
    case MappingStyle::kV:
      if (num_stages % num_ranks != 0) {
        return absl::InvalidArgumentError(absl::StrCat("num_stages ", num_stages,
                                                       " must be evenly divisible by num_ranks ",
                                                       num_ranks, " for the v mapping style"));
      }
      for (int stage = 0; stage < num_stages; ++stage) {
        const int block = stage / num_ranks;
        const int offset = stage % num_ranks;
        stage_to_rank[stage] = block % 2 == 0 ? offset : num_ranks - 1 - offset;
      }
      break;
  }
  return stage_to_rank;
}

absl::StatusOr<std::vector<std::vector<int>>> RankToStages(int num_stages, int num_ranks,
                                                           MappingStyle style) {
  ASSIGN_OR_RETURN(std::vector<int> stage_to_rank, StageToRank(num_stages, num_ranks, style));
  return InvertStageToRank(stage_to_rank, num_ranks);
}

absl::StatusOr<std::vector<std::vector<int>>> InvertStageToRank(
    const std::vector<int>& stage_to_rank, int num_ranks) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_ranks must be at least 1, got ", num_ranks));
  }
  std::vector<std::vector<int>> rank_to_stages(num_ranks);
  for (int stage = 0; stage < static_cast<int>(stage_to_rank.size()); ++stage) {
    const int rank = stage_to_rank[stage];
    if (rank < 0 || rank >= num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", stage, " is mapped to rank ", rank,
                                                     ", outside [0, ", num_ranks, ")"));
    }
    rank_to_stages[rank].push_back(stage);
  }
  return rank_to_stages;
}

}  // namespace stagecoach::schedule
