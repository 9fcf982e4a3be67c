// ZBVZeroBubble: the zero-bubble "V" schedule (ZB-V, arXiv 2401.10241 section 6) as
// torch.distributed.pipelining lays it out. Every rank holds two stages in "v" placement: its
// "down" stage r (forwards flow towards higher ranks) and its "up" stage 2*ranks-1-r (forwards
// flow back towards rank 0). Backwards are split into I (input gradient, on the critical path) and
// W (weight gradient, free to move), and the Ws fill what would otherwise be bubbles.
#include <algorithm>
#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/generators/kinds.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule::internal {
namespace {

absl::Status CheckTwoStagesPerRank(const ScheduleConfig& config) {
  if (config.stages_per_rank != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ZBV requires exactly 2 stages per rank, but got ", config.stages_per_rank, "."));
  }
  return absl::OkStatus();
}

// Appends one rank's actions, numbering the microbatches of each (chunk, type) in order. The
// caller lays the rank out for at least 2*ranks-1 microbatches (enough to fill the pipeline); an
// action on a microbatch >= `num_microbatches` becomes an idle slot, which keeps the timing of the
// rest intact (dependencies never cross microbatches, so dropping whole microbatches keeps the
// order valid and deadlock-free).
class ZbvRankWriter {
 public:
  ZbvRankWriter(int down_stage, int up_stage, int num_microbatches, RankActions& out)
      : stages_{down_stage, up_stage}, num_microbatches_(num_microbatches), out_(out) {}

  void Forward(VChunk chunk) { Emit(chunk, ActionType::kForward, next_forward_[chunk]++); }
  void Input(VChunk chunk) { Emit(chunk, ActionType::kBackwardInput, next_input_[chunk]++); }
  void Weight(VChunk chunk) { Emit(chunk, ActionType::kBackwardWeight, next_weight_[chunk]++); }

  // Input then Weight of the same microbatch: a full backward with nothing in between.
  void InputAndWeight(VChunk chunk) {
    Input(chunk);
    Weight(chunk);
  }

  int forwards(VChunk chunk) const { return next_forward_[chunk]; }
  bool HasPendingWeight(VChunk chunk) const { return next_weight_[chunk] < next_input_[chunk]; }

 private:
  void Emit(VChunk chunk, ActionType type, int microbatch) {
    if (microbatch >= num_microbatches_) {
      out_.push_back(std::nullopt);
    } else {
      out_.push_back(Action::Make(stages_[chunk], type, microbatch));
    }
  }

  std::array<int, 2> stages_;
  int num_microbatches_;
  RankActions& out_;
  std::array<int, 2> next_forward_ = {0, 0};
  std::array<int, 2> next_input_ = {0, 0};
  std::array<int, 2> next_weight_ = {0, 0};
};

// Rank `rank` of `num_ranks`, laid out for `padded` microbatches.
void WriteZbvRank(int rank, int num_ranks, int padded, ZbvRankWriter& writer) {
  // Warm-up. Rank r runs down forwards until microbatch 0 has travelled to the turn of the V and
  // back to its up stage (2*(ranks-r)-1 slots); then it interleaves up and down forwards (r
  // pairs); then each up forward is followed at once by a full backward (I, W) of the up stage, as
  // the gradients coming back from the last stage arrive.
  for (int i = 0; i < 2 * (num_ranks - rank) - 1; ++i) writer.Forward(kDown);
  for (int i = 0; i < rank; ++i) {
    writer.Forward(kUp);
    writer.Forward(kDown);
  }
  for (int i = 0; i < num_ranks - rank; ++i) {
    writer.Forward(kUp);
    writer.InputAndWeight(kUp);
  }

  // Stable phase: per step one forward and one full (I, W) backward on each stage, down first.
  // Once all `padded` down forwards are out, the step goes on without its down forward until the
  // up stage has caught up.
  while (writer.forwards(kUp) < writer.forwards(kDown) || writer.forwards(kDown) < padded) {
    if (writer.forwards(kDown) < padded) writer.Forward(kDown);
    writer.InputAndWeight(kDown);
    writer.Forward(kUp);
    writer.InputAndWeight(kUp);
  }

  // Cool-down. Input gradients are urgent (neighbouring ranks wait for them), weights are not: r
  // pairs of I on both stages, then down-stage I each followed by the oldest pending down W, then
  // every W left, up stage first.
  for (int i = 0; i < rank; ++i) {
    writer.Input(kDown);
    writer.Input(kUp);
  }
  for (int i = 0; i < num_ranks - rank; ++i) {
    writer.Input(kDown);
    writer.Weight(kDown);
  }
  while (writer.HasPendingWeight(kUp)) writer.Weight(kUp);
  while (writer.HasPendingWeight(kDown)) writer.Weight(kDown);
}

}  // namespace

// Rank r: r idle slots, then the warm-up, stable and cool-down phases of WriteZbvRank, laid out
// for max(2*ranks-1, m) microbatches with the microbatches >= m left as idle slots.
absl::StatusOr<PipelineOrder> GenerateZBVZeroBubble(const ScheduleConfig& config) {
  RETURN_IF_ERROR(CheckTwoStagesPerRank(config));
  const int num_ranks = config.num_ranks;
  const int num_stages = NumStages(config);
  const int padded = std::max(2 * num_ranks - 1, config.num_microbatches);
  PipelineOrder order(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    RankActions& actions = order[rank];
    // Per rank: 3 actions per microbatch and stage, plus the leading idle slots.
    actions.reserve(rank + 6 * static_cast<size_t>(padded));
    AppendIdle(actions, rank);
    ZbvRankWriter writer(rank, num_stages - 1 - rank, config.num_microbatches, actions);
    WriteZbvRank(rank, num_ranks, padded, writer);
  }
  return order;
}

}  // namespace stagecoach::schedule::internal
