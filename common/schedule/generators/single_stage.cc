// GPipe and 1F1B (one stage per rank), and forward-only inference.
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/generators/kinds.h"

namespace stagecoach::schedule::internal {
namespace {

absl::Status CheckSingleStage(const ScheduleConfig& config) {
  if (config.stages_per_rank != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        ScheduleKindName(config.kind), " runs exactly one stage per rank, but stages_per_rank is ",
        config.stages_per_rank));
  }
  return absl::OkStatus();
}

}  // namespace

// Rank r: r idle slots, F0..F(m-1), 3*(pp-1-r) idle slots, B0..B(m-1).
absl::StatusOr<PipelineOrder> GenerateGPipe(const ScheduleConfig& config) {
  if (absl::Status status = CheckSingleStage(config); !status.ok()) return status;
  const int num_ranks = config.num_ranks;
  const int num_microbatches = config.num_microbatches;
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
absl::StatusOr<PipelineOrder> Generate1F1B(const ScheduleConfig& config) {
  if (absl::Status status = CheckSingleStage(config); !status.ok()) return status;
  const int num_ranks = config.num_ranks;
  const int num_microbatches = config.num_microbatches;
  const int num_stages = NumStages(config);
  if (num_microbatches < num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Number of microbatches (", num_microbatches,
        ") must be greater than or equal to the number of stages (", num_stages, ")."));
  }
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

// Unit-time list scheduling of forwards over loop-placed stages. Each stage runs its microbatches
// in order; F(s, mb) is ready once F(s-1, mb) finished in an earlier slot. In every slot each rank
// runs its ready forward of the highest stage (depth-first: the first outputs leave the pipeline
// as early as possible) or idles. With one stage per rank, rank r is r idle slots then F0..F(m-1).
absl::StatusOr<PipelineOrder> GenerateForwardOnly(const ScheduleConfig& config) {
  const int num_ranks = config.num_ranks;
  const int num_microbatches = config.num_microbatches;
  const int num_stages = NumStages(config);
  PipelineOrder order(num_ranks);
  std::vector<int> next_mb(num_stages, 0);
  // done_slot[s]: for each finished forward of stage s (in mb order), the slot it ran in.
  std::vector<std::vector<int>> done_slot(num_stages);
  int remaining = num_stages * num_microbatches;
  for (int slot = 0; remaining > 0; ++slot) {
    for (int rank = 0; rank < num_ranks; ++rank) {
      int chosen = -1;
      for (int stage = rank + (config.stages_per_rank - 1) * num_ranks; stage >= 0;
           stage -= num_ranks) {
        const int mb = next_mb[stage];
        if (mb >= num_microbatches) continue;
        if (stage > 0 && (static_cast<int>(done_slot[stage - 1].size()) <= mb ||
                          done_slot[stage - 1][mb] >= slot)) {
          continue;
        }
        chosen = stage;
        break;
      }
      if (chosen < 0) {
        order[rank].push_back(std::nullopt);
        continue;
      }
      order[rank].push_back(Action::Make(chosen, ActionType::kForward, next_mb[chosen]++));
      done_slot[chosen].push_back(slot);
      --remaining;
    }
  }
  // Trailing idle slots carry no timing information.
  for (RankActions& actions : order) {
    while (!actions.empty() && !actions.back().has_value()) actions.pop_back();
  }
  return order;
}

}  // namespace stagecoach::schedule::internal
