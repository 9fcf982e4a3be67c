// VHalf and VMin: "V" schedules whose activation memory is bounded below ZB-V's, after
// "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024), which reaches about
// 1/2 (V-Half) and 1/3 (V-Min) of 1F1B's activation memory with V-shaped building blocks.
//
// Our construction is not the paper's building blocks: it is a unit-time list scheduler over the
// same V placement (rank r holds its "down" stage r and its "up" stage 2p-1-r) with the backward
// split into I and W, whose every rank keeps at most the paper's activation budget:
//   V-Half: 2 * floor((p + 2) / 2) stage activations (the paper's (p+2)//2 microbatches of a
//           rank's layers), V-Min: 2 * floor((p + 4) / 3) (its (p+4)//3),
// against ZB-V's and 1F1B's 2p. At each tick every rank runs one ready pass, in this order of
// preference: an I (the oldest microbatch; the up stage on a tie), the F of its up stage, the F of
// its down stage if the budget allows, else a pending W (which frees what its I kept). A down
// stage F reserves the slot its microbatch's up stage F will need, so an admitted microbatch can
// always pass the V on every rank: the schedule cannot deadlock, and the ticks a rank waits are
// the bubbles the budget costs (simulate them: stagectl schedule --simulate).
#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/generators/kinds.h"

namespace stagecoach::schedule::internal {
namespace {

constexpr int kNotDone = -1;

class BudgetedVScheduler {
 public:
  // `budget`: the most stage activations a rank holds (F allocates one, W frees it); >= 2.
  BudgetedVScheduler(int ranks, int microbatches, int budget)
      : p_(ranks),
        m_(microbatches),
        budget_(budget),
        forward_done_(static_cast<size_t>(2 * ranks) * microbatches, kNotDone),
        input_done_(static_cast<size_t>(2 * ranks) * microbatches, kNotDone),
        ranks_(ranks),
        order_(ranks) {}

  absl::StatusOr<PipelineOrder> Run(absl::string_view name) {
    const int64_t passes = 6LL * p_ * m_;
    int64_t done = 0;
    int idle_ticks = 0;
    for (int tick = 0; done < passes; ++tick) {
      int acted = 0;
      for (int r = 0; r < p_; ++r) {
        const std::optional<Action> action = Choose(r, tick);
        order_[r].push_back(action);
        if (action.has_value()) ++acted;
      }
      done += acted;
      idle_ticks = acted == 0 ? idle_ticks + 1 : 0;
      if (idle_ticks > 1) {
        return absl::InternalError(
            absl::StrCat(name, " with ", p_, " ranks, ", m_, " microbatches and a budget of ",
                         budget_, " stage activations made no progress at tick ", tick));
      }
    }
    for (RankActions& actions : order_) {  // no trailing idle slots
      while (!actions.empty() && !actions.back().has_value()) actions.pop_back();
    }
    return std::move(order_);
  }

 private:
  struct RankState {
    int next_forward[2] = {0, 0};
    int next_input[2] = {0, 0};
    std::deque<std::pair<int, int>> pending_weights;  // (chunk, microbatch) after their I
    int held = 0;                                     // stage activations from F to W
    int reserved = 0;  // up-stage slots of microbatches that passed the down stage
  };

  int Stage(int rank, int chunk) const { return chunk == 0 ? rank : 2 * p_ - 1 - rank; }
  size_t Index(int stage, int mb) const { return static_cast<size_t>(stage) * m_ + mb; }
  bool Done(const std::vector<int>& done, int stage, int mb, int tick) const {
    const int at = done[Index(stage, mb)];
    return at != kNotDone && at <= tick;
  }

  bool ForwardReady(int r, int chunk, int tick) const {
    const int mb = ranks_[r].next_forward[chunk];
    if (mb >= m_) return false;
    const int s = Stage(r, chunk);
    return s == 0 || Done(forward_done_, s - 1, mb, tick);
  }

  bool InputReady(int r, int chunk, int tick) const {
    const RankState& st = ranks_[r];
    const int mb = st.next_input[chunk];
    if (mb >= m_ || mb >= st.next_forward[chunk]) return false;
    const int s = Stage(r, chunk);
    return s == 2 * p_ - 1 ? Done(forward_done_, s, mb, tick) : Done(input_done_, s + 1, mb, tick);
  }

  // The pass rank `r` runs at `tick`, applied to the state; nullopt when none is ready.
  std::optional<Action> Choose(int r, int tick) {
    RankState& st = ranks_[r];
    const bool input_up = InputReady(r, 1, tick);
    const bool input_down = InputReady(r, 0, tick);
    if (input_up || input_down) {
      const int chunk = input_up && (!input_down || st.next_input[1] <= st.next_input[0]) ? 1 : 0;
      const int mb = st.next_input[chunk]++;
      input_done_[Index(Stage(r, chunk), mb)] = tick + 1;
      st.pending_weights.emplace_back(chunk, mb);
      return Action::Make(Stage(r, chunk), ActionType::kBackwardInput, mb);
    }
    if (ForwardReady(r, 1, tick)) {
      --st.reserved;
      return Forward(r, 1, tick);
    }
    if (ForwardReady(r, 0, tick) && st.held + st.reserved + 2 <= budget_) {
      ++st.reserved;
      return Forward(r, 0, tick);
    }
    if (!st.pending_weights.empty()) {
      const auto [chunk, mb] = st.pending_weights.front();
      if (Done(input_done_, Stage(r, chunk), mb, tick)) {
        st.pending_weights.pop_front();
        --st.held;
        return Action::Make(Stage(r, chunk), ActionType::kBackwardWeight, mb);
      }
    }
    return std::nullopt;
  }

  Action Forward(int r, int chunk, int tick) {
    RankState& st = ranks_[r];
    const int mb = st.next_forward[chunk]++;
    forward_done_[Index(Stage(r, chunk), mb)] = tick + 1;
    ++st.held;
    return Action::Make(Stage(r, chunk), ActionType::kForward, mb);
  }

  const int p_;
  const int m_;
  const int budget_;
  std::vector<int> forward_done_;  // per (stage, microbatch): the tick its F ends, or kNotDone
  std::vector<int> input_done_;    // the same for I
  std::vector<RankState> ranks_;
  PipelineOrder order_;
};

absl::StatusOr<PipelineOrder> GenerateBudgetedV(const ScheduleConfig& config,
                                                absl::string_view name, int budget_microbatches) {
  if (config.stages_per_rank != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " requires exactly 2 stages per rank, but got ", config.stages_per_rank, "."));
  }
  return BudgetedVScheduler(config.num_ranks, config.num_microbatches, 2 * budget_microbatches)
      .Run(name);
}

}  // namespace

absl::StatusOr<PipelineOrder> GenerateVHalf(const ScheduleConfig& config) {
  return GenerateBudgetedV(config, "VHalf", (config.num_ranks + 2) / 2);
}

absl::StatusOr<PipelineOrder> GenerateVMin(const ScheduleConfig& config) {
  return GenerateBudgetedV(config, "VMin", (config.num_ranks + 4) / 3);
}

}  // namespace stagecoach::schedule::internal
