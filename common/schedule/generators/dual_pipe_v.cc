// DualPipeV: DeepSeek's DualPipe (arXiv 2412.19437) folded into a "V", as torch.distributed.
// pipelining lays it out. Every rank holds two stages in "v" placement: its "down" stage r and its
// "up" stage 2*ranks-1-r. In the steady state a forward on one stage is paired with a full
// backward on the other (an OVERLAP_F_B container) so that one's communication hides behind the
// other's compute; at the edges of the schedule backwards are split into I and W, and the Ws
// (taken first in, first out) fill the gaps.
#include <array>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/generators/kinds.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule::internal {
namespace {

absl::Status CheckDualPipeVConfig(const ScheduleConfig& config) {
  if (config.stages_per_rank != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ZBV requires exactly 2 stages per rank, but got ", config.stages_per_rank, "."));
  }
  const int num_stages = NumStages(config);
  if (config.num_microbatches < num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("DualPipeV requires at least as many microbatches as stages, but got ",
                     config.num_microbatches, " microbatches and ", num_stages, " stages."));
  }
  return absl::OkStatus();
}

// Appends one rank's actions. Each stage numbers its forwards and its backwards (B or I)
// separately, in order; every I queues its W, and Ws are emitted oldest first.
class DualPipeVRankWriter {
 public:
  DualPipeVRankWriter(int down_stage, int up_stage, RankActions& out)
      : stages_{down_stage, up_stage}, out_(out) {}

  void Forward(VChunk chunk) { out_.push_back(NextForward(chunk)); }

  // A full backward (B), or with `split` only its input half (I), whose W is queued.
  void Backward(VChunk chunk, bool split) {
    if (!split) {
      out_.push_back(NextFullBackward(chunk));
      return;
    }
    const int microbatch = next_backward_[chunk]++;
    out_.push_back(Action::Make(stages_[chunk], ActionType::kBackwardInput, microbatch));
    pending_weights_.emplace_back(stages_[chunk], microbatch);
  }

  // The next forward of `forward_chunk` overlapped with the next full backward of
  // `backward_chunk`.
  void OverlappedForwardBackward(VChunk forward_chunk, VChunk backward_chunk) {
    Action forward = NextForward(forward_chunk);
    Action backward = NextFullBackward(backward_chunk);
    out_.push_back(Action{-1, ActionType::kOverlapFB, std::nullopt, {forward, backward}});
  }

  // The oldest queued W, if any (nothing otherwise).
  void WeightIfPending() {
    if (pending_weights_.empty()) return;
    const auto [stage, microbatch] = pending_weights_.front();
    pending_weights_.pop_front();
    out_.push_back(Action::Make(stage, ActionType::kBackwardWeight, microbatch));
  }

 private:
  Action NextForward(VChunk chunk) {
    return Action::Make(stages_[chunk], ActionType::kForward, next_forward_[chunk]++);
  }
  Action NextFullBackward(VChunk chunk) {
    return Action::Make(stages_[chunk], ActionType::kFullBackward, next_backward_[chunk]++);
  }

  std::array<int, 2> stages_;
  RankActions& out_;
  std::array<int, 2> next_forward_ = {0, 0};
  std::array<int, 2> next_backward_ = {0, 0};
  // (stage, microbatch) of each I whose W has not been emitted yet, oldest first.
  std::deque<std::pair<int, int>> pending_weights_;
};

// Rank `rank` of `num_ranks` with `num_microbatches` (>= 2*num_ranks) microbatches, in eight
// steps. `after_last` = num_ranks-1-rank is the number of ranks after this one.
void WriteDualPipeVRank(int rank, int num_ranks, int num_microbatches, DualPipeVRankWriter& w) {
  const int after_last = num_ranks - 1 - rank;
  const bool is_last_rank = after_last == 0;

  // 1. Down forwards only, while the first microbatches travel to the bottom of the V.
  for (int i = 0; i < 2 * after_last; ++i) w.Forward(kDown);

  // 2. Down and up forwards alternate as microbatches start coming back up.
  for (int i = 0; i < rank + 1; ++i) {
    w.Forward(kDown);
    w.Forward(kUp);
  }

  // 3. The first up-stage gradients arrive: split backward (I), the oldest queued W, up forward.
  for (int i = 0; i < after_last; ++i) {
    w.Backward(kUp, /*split=*/true);
    w.WeightIfPending();
    w.Forward(kUp);
  }

  // 4. Steady state: (down forward; up backward) then (up forward; down backward), both
  // overlapped. The last rank runs its first down forward and up backward one after the other,
  // not overlapped, which shortens the bubble there.
  const int steady_steps = num_microbatches - 2 * num_ranks + rank + 1;
  for (int i = 0; i < steady_steps; ++i) {
    if (i == 0 && is_last_rank) {
      w.Forward(kDown);
      w.Backward(kUp, /*split=*/false);
    } else {
      w.OverlappedForwardBackward(kDown, kUp);
    }
    w.OverlappedForwardBackward(kUp, kDown);
  }

  // 5. The down forwards are done: up backward, then (up forward; down backward) overlapped.
  for (int i = 0; i < after_last; ++i) {
    w.Backward(kUp, /*split=*/false);
    w.OverlappedForwardBackward(kUp, kDown);
  }

  // 6. Forwards are done: up and down backwards alternate. From the middle pair on they are
  // split (I, with the Ws deferred to fill the drain); odd ranks split the whole middle pair,
  // even ranks only its down backward.
  const int pairs = rank + 1;
  const int middle = pairs / 2;
  const bool odd_rank = rank % 2 == 1;
  for (int i = 0; i < pairs; ++i) {
    w.Backward(kUp, /*split=*/i > middle || (i == middle && odd_rank));
    w.Backward(kDown, /*split=*/i >= middle);
  }

  // 7. The remaining down backwards, split, each after the oldest queued W.
  for (int i = 0; i < after_last; ++i) {
    w.WeightIfPending();
    w.Backward(kDown, /*split=*/true);
  }

  // 8. The remaining queued Ws.
  for (int i = 0; i < rank + 1; ++i) w.WeightIfPending();
}

}  // namespace

// Rank r runs the eight steps of WriteDualPipeVRank on its stages of the "v" mapping; no idle
// slots.
absl::StatusOr<PipelineOrder> GenerateDualPipeV(const ScheduleConfig& config) {
  RETURN_IF_ERROR(CheckDualPipeVConfig(config));
  const int num_ranks = config.num_ranks;
  ASSIGN_OR_RETURN(const std::vector<std::vector<int>> rank_to_stages,
                   RankToStages(NumStages(config), num_ranks, MappingStyle::kV));
  PipelineOrder order(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    const std::vector<int>& stages = rank_to_stages[rank];
    // Per rank: at most 3 entries per microbatch and stage.
    order[rank].reserve(6 * static_cast<size_t>(config.num_microbatches));
    DualPipeVRankWriter writer(stages[0], stages[1], order[rank]);
    WriteDualPipeVRank(rank, num_ranks, config.num_microbatches, writer);
  }
  return order;
}

}  // namespace stagecoach::schedule::internal
