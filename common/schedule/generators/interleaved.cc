// Interleaved 1F1B and Interleaved Zero Bubble (ZB1P): depth-first schedules over several
// loop-placed stages per rank (stage s on rank s % num_ranks), built as
// torch.distributed.pipelining builds them.
//
// Both schedules share one per-rank template. The microbatches are cut into rounds of
// `microbatches_per_round` (mpr) consecutive microbatches. A rank's k-th forward belongs to chunk
// k / mpr, and the chunks visit the rank's local stages in turn: mpr forwards of its first stage,
// mpr of its second, ..., then the next round starts again at its first stage. Its backwards walk
// the same chunks with the local stages mirrored (last local stage first). Rank r's list is:
//   - r idle slots: stage r's first input is ready one slot after stage r-1's;
//   - warm-up: the first `warmup` forwards, then idle slots while the first gradient travels back;
//   - steady state: one forward then one backward until every forward is issued;
//   - cool-down: the remaining backwards.
// The warm-up covers the first round of every local stage but the last, so that the last local
// stage's first chunk is under way when the steady state starts, plus a few more forwards per
// rank of distance from the last rank (two per rank for 1F1B, one for zero bubble), capped at the
// total number of forwards.
//
// The idle-slot counts assume rounds of num_ranks microbatches. Otherwise (fewer microbatches
// than ranks; for 1F1B also a microbatch count that is not a multiple of num_ranks) PyTorch's
// slots contradict some dependencies, e.g. a forward sharing a slot with the forward it consumes.
// The lists are still valid as per-rank orders, and we keep PyTorch's slots.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/schedule/generators/kinds.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule::internal {
namespace {

// Sizes shared by every rank of an interleaved schedule.
struct InterleavedShape {
  int num_ranks = 1;
  int stages_per_rank = 1;
  int num_microbatches = 1;
  int microbatches_per_round = 1;

  int num_forwards() const { return stages_per_rank * num_microbatches; }
};

// PyTorch's rounds rule: rounds = max(1, m / num_ranks), and m must be a multiple of it. The error
// starts with `schedule_phrase` ("Interleaved 1F1B", "Zero bubble"), as PyTorch's does.
absl::StatusOr<InterleavedShape> MakeShape(const ScheduleConfig& config,
                                           absl::string_view schedule_phrase) {
  const int num_microbatches = config.num_microbatches;
  const int rounds = std::max(1, num_microbatches / config.num_ranks);
  if (num_microbatches % rounds != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        schedule_phrase,
        " requires the number of microbatches to be a multiple of the number of rounds (", rounds,
        "), but got ", num_microbatches, "."));
  }
  return InterleavedShape{config.num_ranks, config.stages_per_rank, num_microbatches,
                          num_microbatches / rounds};
}

// Forwards a rank issues before its first backward: the first round of every local stage but the
// last, plus `per_hop` per rank between this one and the last rank; never more than all of them.
int WarmupForwards(const InterleavedShape& shape, int rank, int per_hop) {
  const int warmup = (shape.stages_per_rank - 1) * shape.microbatches_per_round +
                     per_hop * (shape.num_ranks - 1 - rank);
  return std::min(warmup, shape.num_forwards());
}

// One entry of a rank's list as planned: an action, or an idle slot (stage < 0). Kept compact
// so that the lists can be built and re-timed before any Action is made.
struct PlannedOp {
  int stage = -1;
  ActionType type = ActionType::kForward;
  int microbatch = 0;

  bool idle() const { return stage < 0; }
  Action ToAction() const { return Action::Make(stage, type, microbatch); }
};

using RankPlan = std::vector<PlannedOp>;

// One rank's list under construction. Forwards and backwards are numbered in issue order (the
// k-th forward, the k-th backward); the number decides the stage, and each stage hands out its
// microbatches in increasing order.
class RankProgram {
 public:
  RankProgram(const InterleavedShape& shape, int rank)
      : shape_(shape),
        rank_(rank),
        next_forward_mb_(shape.stages_per_rank, 0),
        next_backward_mb_(shape.stages_per_rank, 0) {
    plan_.reserve(rank + 4 * shape.num_forwards());
  }

  void Idle(int count) { plan_.insert(plan_.end(), count, PlannedOp{}); }

  // Appends the `index`-th forward: chunk index / mpr, local stages in increasing order.
  void Forward(int index) {
    const int local = (index / shape_.microbatches_per_round) % shape_.stages_per_rank;
    plan_.push_back({StageOf(local), ActionType::kForward, next_forward_mb_[local]++});
  }

  // Appends the `index`-th backward (B, or I whose W is queued): chunk index / mpr, local stages
  // in decreasing order.
  void Backward(int index, ActionType type) {
    const int local = shape_.stages_per_rank - 1 -
                      (index / shape_.microbatches_per_round) % shape_.stages_per_rank;
    plan_.push_back({StageOf(local), type, next_backward_mb_[local]++});
    if (type == ActionType::kBackwardInput) pending_weights_.push_back(plan_.back());
  }

  // Appends the W of the oldest I that has none yet, if any; returns whether it did.
  bool Weight() {
    if (next_weight_ == pending_weights_.size()) return false;
    PlannedOp weight = pending_weights_[next_weight_++];
    weight.type = ActionType::kBackwardWeight;
    plan_.push_back(weight);
    return true;
  }

  RankPlan Release() && { return std::move(plan_); }

 private:
  int StageOf(int local) const { return local * shape_.num_ranks + rank_; }

  const InterleavedShape& shape_;
  const int rank_;
  RankPlan plan_;
  std::vector<int> next_forward_mb_;   // per local stage
  std::vector<int> next_backward_mb_;  // per local stage
  // Every I issued, in order; those from next_weight_ on still need their W.
  RankPlan pending_weights_;
  size_t next_weight_ = 0;
};

// The plan as it stands, one slot per entry.
RankActions Materialize(const RankPlan& plan) {
  RankActions actions;
  actions.reserve(plan.size());
  for (const PlannedOp& op : plan) {
    if (op.idle()) {
      actions.push_back(std::nullopt);
    } else {
      actions.push_back(op.ToAction());
    }
  }
  return actions;
}

// Interleaved 1F1B for one rank. After the warm-up the rank idles until its first backward can
// arrive: slot stages * num_ranks + 2 * (hops to the last rank), counting the leading idle slots.
// In the cool-down each backward is preceded by an idle slot, where the steady state had its
// forward, so the ranks stay aligned in time.
RankPlan Interleaved1F1BRank(const InterleavedShape& shape, int rank) {
  const int warmup = WarmupForwards(shape, rank, /*per_hop=*/2);
  const int num_forwards = shape.num_forwards();
  const int first_backward_slot =
      shape.stages_per_rank * shape.num_ranks + 2 * (shape.num_ranks - 1 - rank);
  RankProgram program(shape, rank);
  program.Idle(rank);
  for (int i = 0; i < warmup; ++i) program.Forward(i);
  // As in PyTorch, a rank without warm-up forwards gets no post-warm-up idle slots, and a warm-up
  // that already reaches the first backward's slot none either.
  if (warmup > 0) program.Idle(std::max(0, first_backward_slot - (rank + warmup)));
  for (int i = warmup; i < num_forwards; ++i) {
    program.Forward(i);
    program.Backward(i - warmup, ActionType::kFullBackward);
  }
  for (int i = num_forwards - warmup; i < num_forwards; ++i) {
    program.Idle(1);
    program.Backward(i, ActionType::kFullBackward);
  }
  return std::move(program).Release();
}

// Interleaved zero bubble for one rank, before bubble insertion. The warm-up grows by one forward
// per hop and is followed by one idle slot per hop. The backward is split: each steady or
// cool-down step issues F (steady only) and I, and from the rank's (rank+1)-th backward on also
// the W of the oldest I still without one; the Ws left over close the list.
RankPlan ZeroBubbleRank(const InterleavedShape& shape, int rank) {
  const int warmup = WarmupForwards(shape, rank, /*per_hop=*/1);
  const int num_forwards = shape.num_forwards();
  RankProgram program(shape, rank);
  program.Idle(rank);
  for (int i = 0; i < warmup; ++i) program.Forward(i);
  if (warmup > 0) program.Idle(shape.num_ranks - 1 - rank);
  for (int backward = 0; backward < num_forwards; ++backward) {
    const int forward = warmup + backward;
    if (forward < num_forwards) program.Forward(forward);
    program.Backward(backward, ActionType::kBackwardInput);
    if (backward >= rank) program.Weight();
  }
  while (program.Weight()) {
  }
  return std::move(program).Release();
}

// PyTorch's bubble insertion for zero bubble (_add_bubbles_to_actions). PyTorch replays the
// per-rank lists slot by slot, all ranks in lock step: a forward whose input, the forward of the
// previous stage for the same microbatch, has not run in an earlier slot is delayed by an idle
// slot (the list is not consumed); everything else, idle slots included, takes its slot. Only
// forwards wait: PyTorch checks the input gradient only for full backwards (B), which this
// schedule does not emit, so I and W are never delayed.
//
// Rather than re-scanning every rank at every slot, this computes the same slots directly: an
// entry lands one slot after its predecessor on the rank, and a forward also at least one slot
// after its input. Each rank is run ahead until it reaches a forward whose input has no slot
// yet; it parks there and resumes when that input gets one. Every entry is handled once, so the
// pass is linear in the size of the result.
class ForwardBubbleInserter {
 public:
  ForwardBubbleInserter(std::vector<RankPlan> plans, int num_stages, int num_microbatches)
      : plans_(std::move(plans)),
        num_ranks_(static_cast<int>(plans_.size())),
        num_stages_(num_stages),
        num_microbatches_(num_microbatches),
        forward_slot_(static_cast<size_t>(num_stages) * num_microbatches, -1),
        slots_(num_ranks_),
        next_slot_(num_ranks_, 0),
        awaited_(num_ranks_, -1) {
    for (int rank = 0; rank < num_ranks_; ++rank) slots_[rank].reserve(plans_[rank].size());
  }

  absl::StatusOr<PipelineOrder> Run() && {
    std::vector<int> runnable;
    for (int rank = num_ranks_ - 1; rank >= 0; --rank) runnable.push_back(rank);
    while (!runnable.empty()) {
      const int rank = runnable.back();
      runnable.pop_back();
      RunUntilBlocked(rank, runnable);
    }
    PipelineOrder order(num_ranks_);
    for (int rank = 0; rank < num_ranks_; ++rank) {
      if (slots_[rank].size() != plans_[rank].size()) {
        // PyTorch would loop forever here.
        return absl::InternalError(absl::StrCat("zero bubble: the forwards of rank ", rank,
                                                " wait on a forward that never runs"));
      }
      order[rank] = Place(rank);
    }
    return order;
  }

 private:
  int Key(int stage, int mb) const { return stage * num_microbatches_ + mb; }

  // Gives slots to the entries of `rank` until one waits for an input without a slot (recorded
  // in awaited_) or the plan ends. Ranks waiting for a forward placed here join `runnable`.
  void RunUntilBlocked(int rank, std::vector<int>& runnable) {
    const RankPlan& plan = plans_[rank];
    std::vector<int>& slots = slots_[rank];
    int& next_slot = next_slot_[rank];
    while (slots.size() < plan.size()) {
      const PlannedOp& op = plan[slots.size()];
      if (op.idle() || op.type != ActionType::kForward) {
        slots.push_back(next_slot++);
        continue;
      }
      if (op.stage > 0) {
        const int input_slot = forward_slot_[Key(op.stage - 1, op.microbatch)];
        if (input_slot < 0) {
          awaited_[rank] = Key(op.stage - 1, op.microbatch);
          return;
        }
        next_slot = std::max(next_slot, input_slot + 1);
      }
      forward_slot_[Key(op.stage, op.microbatch)] = next_slot;
      slots.push_back(next_slot++);
      WakeConsumer(op.stage, op.microbatch, runnable);
    }
  }

  // F(stage + 1, mb) consumes F(stage, mb); if its rank is parked on it, it may run again.
  void WakeConsumer(int stage, int mb, std::vector<int>& runnable) {
    if (stage + 1 >= num_stages_) return;
    const int consumer = (stage + 1) % num_ranks_;
    if (awaited_[consumer] != Key(stage, mb)) return;
    awaited_[consumer] = -1;
    runnable.push_back(consumer);
  }

  // The rank's list with each entry at its slot and idle slots in the gaps.
  RankActions Place(int rank) const {
    const RankPlan& plan = plans_[rank];
    const std::vector<int>& slots = slots_[rank];
    RankActions actions(plan.empty() ? 0 : slots.back() + 1);
    for (size_t i = 0; i < plan.size(); ++i) {
      if (!plan[i].idle()) actions[slots[i]] = plan[i].ToAction();
    }
    return actions;
  }

  const std::vector<RankPlan> plans_;
  const int num_ranks_;
  const int num_stages_;
  const int num_microbatches_;
  // forward_slot_[Key(stage, mb)]: the slot of F(stage, mb); -1 until it has one.
  std::vector<int> forward_slot_;
  std::vector<std::vector<int>> slots_;  // per rank: the slots of its first entries
  std::vector<int> next_slot_;           // per rank: the first slot after its last placed entry
  std::vector<int> awaited_;             // per rank: Key() of the forward it is parked on, or -1
};

}  // namespace

absl::StatusOr<PipelineOrder> GenerateInterleaved1F1B(const ScheduleConfig& config) {
  ASSIGN_OR_RETURN(const InterleavedShape shape, MakeShape(config, "Interleaved 1F1B"));
  PipelineOrder order;
  order.reserve(config.num_ranks);
  for (int rank = 0; rank < config.num_ranks; ++rank) {
    order.push_back(Materialize(Interleaved1F1BRank(shape, rank)));
  }
  return order;
}

absl::StatusOr<PipelineOrder> GenerateInterleavedZeroBubble(const ScheduleConfig& config) {
  ASSIGN_OR_RETURN(const InterleavedShape shape, MakeShape(config, "Zero bubble"));
  std::vector<RankPlan> plans;
  plans.reserve(config.num_ranks);
  for (int rank = 0; rank < config.num_ranks; ++rank) {
    plans.push_back(ZeroBubbleRank(shape, rank));
  }
  return ForwardBubbleInserter(std::move(plans), NumStages(config), config.num_microbatches).Run();
}

}  // namespace stagecoach::schedule::internal
