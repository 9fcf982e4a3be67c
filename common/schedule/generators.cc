#include "common/schedule/generators.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/generators/kinds.h"
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
  const std::string valid = absl::StrJoin(names, ", ");
  for (absl::string_view base : {"PipelineScheduleSingle", "PipelineScheduleMulti"}) {
    if (absl::EqualsIgnoreCase(name, base)) {
      return absl::InvalidArgumentError(absl::StrCat("'", name,
                                                     "' is a PyTorch base class, not a schedule; "
                                                     "valid schedules: ",
                                                     valid));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", name, "'; valid schedules: ", valid));
}

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "GPipe";
    case ScheduleKind::k1F1B:
      return "1F1B";
    case ScheduleKind::kInterleaved1F1B:
      return "Interleaved1F1B";
    case ScheduleKind::kLoopedBFS:
      return "LoopedBFS";
    case ScheduleKind::kInterleavedZeroBubble:
      return "InterleavedZeroBubble";
    case ScheduleKind::kZBVZeroBubble:
      return "ZBVZeroBubble";
    case ScheduleKind::kDualPipeV:
      return "DualPipeV";
    case ScheduleKind::kVHalf:
      return "VHalf";
    case ScheduleKind::kVMin:
      return "VMin";
    case ScheduleKind::kForwardOnly:
      return "ForwardOnly";
  }
  return "?";
}

bool HasBackward(ScheduleKind kind) { return kind != ScheduleKind::kForwardOnly; }

int DefaultStagesPerRank(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
    case ScheduleKind::kForwardOnly:
      return 1;
    default:
      return 2;
  }
}

const std::vector<ScheduleKind>& AllScheduleKinds() {
  static const auto* kinds = new std::vector<ScheduleKind>{ScheduleKind::kGPipe,
                                                           ScheduleKind::k1F1B,
                                                           ScheduleKind::kInterleaved1F1B,
                                                           ScheduleKind::kLoopedBFS,
                                                           ScheduleKind::kInterleavedZeroBubble,
                                                           ScheduleKind::kZBVZeroBubble,
                                                           ScheduleKind::kDualPipeV,
                                                           ScheduleKind::kVHalf,
                                                           ScheduleKind::kVMin,
                                                           ScheduleKind::kForwardOnly};
  return *kinds;
}

int NumStages(const ScheduleConfig& config) { return config.num_ranks * config.stages_per_rank; }

absl::StatusOr<PipelineOrder> GenerateTimeAligned(const ScheduleConfig& config) {
  RETURN_IF_ERROR(CheckConfig(config));
  switch (config.kind) {
    case ScheduleKind::kGPipe:
      return internal::GenerateGPipe(config);
    case ScheduleKind::k1F1B:
      return internal::Generate1F1B(config);
    case ScheduleKind::kInterleaved1F1B:
      return internal::GenerateInterleaved1F1B(config);
    case ScheduleKind::kLoopedBFS:
      return internal::GenerateLoopedBFS(config);
    case ScheduleKind::kInterleavedZeroBubble:
      return internal::GenerateInterleavedZeroBubble(config);
    case ScheduleKind::kZBVZeroBubble:
      return internal::GenerateZBVZeroBubble(config);
    case ScheduleKind::kDualPipeV:
      return internal::GenerateDualPipeV(config);
    case ScheduleKind::kVHalf:
      return internal::GenerateVHalf(config);
    case ScheduleKind::kVMin:
      return internal::GenerateVMin(config);
    case ScheduleKind::kForwardOnly:
      return internal::GenerateForwardOnly(config);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule kind ", static_cast<int>(config.kind)));
}

absl::StatusOr<PipelineOrder> GenerateSchedule(const ScheduleConfig& config) {
  ASSIGN_OR_RETURN(PipelineOrder order, GenerateTimeAligned(config));
  // PyTorch runs its single-stage schedules' lists through _add_reduce_grad at construction.
  if (config.kind == ScheduleKind::kGPipe || config.kind == ScheduleKind::k1F1B) {
    for (RankActions& actions : order) {
      actions = AddReduceGrad(actions, config.num_microbatches);
    }
  }
  return order;
}

MappingStyle DefaultMappingStyle(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kZBVZeroBubble:
    case ScheduleKind::kDualPipeV:
    case ScheduleKind::kVHalf:
    case ScheduleKind::kVMin:
      return MappingStyle::kV;
    default:
      return MappingStyle::kLoop;
  }
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
