// A lowered schedule's communication checks (validator_parts.h): send/recv placement and order,
// and deadlock freedom by symbolic execution.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/action_table.h"
#include "common/schedule/validator_parts.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule::internal {
namespace {

// Send/recv rules of a lowered schedule, given that the compute rules and stage placement hold
// (so every action of stage s is on rank stage_to_rank[s], and stage and microbatch indices are in
// range).
class CommChecker {
 public:
  CommChecker(const PipelineOrder& order, const std::vector<int>& stage_to_rank,
              int num_microbatches)
      : order_(order),
        report_(order),
        stage_to_rank_(stage_to_rank),
        num_stages_(static_cast<int>(stage_to_rank.size())),
        seen_(num_stages_, num_microbatches, 0),
        count_(num_stages_, num_microbatches, 0) {}

  absl::Status Run() {
    // Per step: placement of comms, SEND after its producer, consumer after its RECV. A stage's
    // actions all sit on one rank, so "seen" is "came earlier on this rank".
    for (size_t rank = 0; rank < order_.size(); ++rank) {
      for (size_t step = 0; step < order_[rank].size(); ++step) {
        if (!order_[rank][step].has_value()) continue;
        const Action& entry = *order_[rank][step];
        for (const Action* leaf : LeafActions(entry)) {
          RETURN_IF_ERROR(CheckStep(*leaf, entry, rank, step));
          if (IsSendOrRecv(leaf->type) && ++count_[*leaf] == 2) {
            return report_.AtStep(rank, step,
                                  absl::StrCat(leaf->ToString(),
                                               " appears twice; each send and receive must "
                                               "appear once"));
          }
        }
        for (const Action* leaf : LeafActions(entry)) {
          if (leaf->microbatch.has_value()) seen_[*leaf] = 1;
        }
      }
    }
    // Pairing, in rank/step order.
    for (size_t rank = 0; rank < order_.size(); ++rank) {
      for (size_t step = 0; step < order_[rank].size(); ++step) {
        if (!order_[rank][step].has_value()) continue;
        const Action& entry = *order_[rank][step];
        if (!IsSendOrRecv(entry.type)) continue;
        RETURN_IF_ERROR(CheckPair(entry, rank, step));
      }
    }
    return absl::OkStatus();
  }

 private:
  bool SameRank(int a, int b) const { return stage_to_rank_[a] == stage_to_rank_[b]; }
  bool Seen(int stage, ActionType type, int mb) const { return seen_(type, stage, mb) != 0; }

  absl::Status CheckStep(const Action& leaf, const Action& entry, size_t rank, size_t step) const {
    const int s = leaf.stage;
    const int mb = leaf.microbatch.value_or(-1);
    const int last = num_stages_ - 1;
    const std::string name = DescribeLeaf(leaf, entry);
    auto fail = [&](auto&&... parts) { return report_.AtStep(rank, step, absl::StrCat(parts...)); };
    switch (leaf.type) {
      case ActionType::kSendF:
        if (s == last) return fail(name, " sends a forward output from the last stage");
        if (SameRank(s, s + 1)) {
          return fail(name, ": stages ", s, " and ", s + 1, " are both on rank ", rank,
                      ", which exchange tensors without send/recv");
        }
        if (!Seen(s, ActionType::kForward, mb)) {
          return fail(name, " comes before ", ActionName(s, ActionType::kForward, mb),
                      ", which produces what it sends");
        }
        break;
      case ActionType::kSendB:
        if (s == 0) return fail(name, " sends an input gradient from stage 0");
        if (SameRank(s, s - 1)) {
          return fail(name, ": stages ", s - 1, " and ", s, " are both on rank ", rank,
                      ", which exchange tensors without send/recv");
        }
        if (!Seen(s, ActionType::kBackwardInput, mb) && !Seen(s, ActionType::kFullBackward, mb)) {
          return fail(name, " comes before ", ActionName(s, ActionType::kBackwardInput, mb), " or ",
                      ActionName(s, ActionType::kFullBackward, mb),
                      ", which produces what it sends");
        }
        break;
      case ActionType::kRecvF:
        if (s == 0) return fail(name, " receives a forward input for stage 0");
        if (SameRank(s - 1, s)) {
          return fail(name, ": stages ", s - 1, " and ", s, " are both on rank ", rank,
                      ", which exchange tensors without send/recv");
        }
        break;
      case ActionType::kRecvB:
        if (s == last) return fail(name, " receives an output gradient for the last stage");
        if (SameRank(s, s + 1)) {
          return fail(name, ": stages ", s, " and ", s + 1, " are both on rank ", rank,
                      ", which exchange tensors without send/recv");
        }
        break;
      case ActionType::kForward:
        if (s > 0 && !SameRank(s - 1, s) && !Seen(s, ActionType::kRecvF, mb)) {
          return fail(name, " consumes the output of stage ", s - 1, " on rank ",
                      stage_to_rank_[s - 1], " but does not come after its ",
                      ActionName(s, ActionType::kRecvF, mb), " on this rank");
        }
        break;
      case ActionType::kBackwardInput:
      case ActionType::kFullBackward:
        if (s < last && !SameRank(s + 1, s) && !Seen(s, ActionType::kRecvB, mb)) {
          return fail(name, " consumes the input gradient of stage ", s + 1, " on rank ",
                      stage_to_rank_[s + 1], " but does not come after its ",
                      ActionName(s, ActionType::kRecvB, mb), " on this rank");
        }
        break;
      default:
        break;
    }
    return absl::OkStatus();
  }

  // The checks above guarantee the peer stage exists and lives on another rank.
  absl::Status CheckPair(const Action& comm, size_t rank, size_t step) const {
    const int s = comm.stage;
    const int mb = *comm.microbatch;
    int peer_stage = 0;
    ActionType peer_type = comm.type;
    switch (comm.type) {
      case ActionType::kSendF:
        peer_stage = s + 1, peer_type = ActionType::kRecvF;
        break;
      case ActionType::kRecvF:
        peer_stage = s - 1, peer_type = ActionType::kSendF;
        break;
      case ActionType::kSendB:
        peer_stage = s - 1, peer_type = ActionType::kRecvB;
        break;
      case ActionType::kRecvB:
        peer_stage = s + 1, peer_type = ActionType::kSendB;
        break;
      default:
        return absl::OkStatus();
    }
    if (count_(peer_type, peer_stage, mb) == 0) {
      return report_.AtStep(
          rank, step,
          absl::StrCat(comm.ToString(), " has no matching ", ActionName(peer_stage, peer_type, mb),
                       " on rank ", stage_to_rank_[peer_stage]));
    }
    return absl::OkStatus();
  }

  const PipelineOrder& order_;
  const Reporter report_;
  const std::vector<int>& stage_to_rank_;
  const int num_stages_;
  internal::ActionTable<uint8_t> seen_;   // leaves processed so far
  internal::ActionTable<uint8_t> count_;  // occurrences of each SEND/RECV (capped at 2)
};

// Executes a lowered schedule symbolically: SEND and RECV never block; a compute action that
// consumes a tensor waits for the peer's SEND (remote producer) or for its producer to have run on
// this rank (local producer). Each round lets every rank run as far as it can, so the work is
// linear in the actions plus the ranks times the rounds.
class DeadlockChecker {
 public:
  DeadlockChecker(const PipelineOrder& order, const std::vector<int>& stage_to_rank,
                  int num_microbatches)
      : order_(order),
        stage_to_rank_(stage_to_rank),
        num_stages_(static_cast<int>(stage_to_rank.size())),
        done_(num_stages_, num_microbatches, 0),
        next_(order.size(), 0) {}

  absl::Status Run() {
    while (true) {
      bool progress = false;
      bool finished = true;
      for (size_t rank = 0; rank < order_.size(); ++rank) {
        while (next_[rank] < order_[rank].size()) {
          const std::optional<Action>& entry = order_[rank][next_[rank]];
          if (entry.has_value()) {
            if (Blocker(rank, *entry).has_value()) break;
            for (const Action* leaf : LeafActions(*entry)) {
              if (leaf->microbatch.has_value()) done_[*leaf] = 1;
            }
          }
          ++next_[rank];
          progress = true;
        }
        if (next_[rank] < order_[rank].size()) finished = false;
      }
      if (finished) return absl::OkStatus();
      if (!progress) return Deadlock();
    }
  }

 private:
  bool Done(int stage, ActionType type, int mb) const { return done_(type, stage, mb) != 0; }

  // What `entry` on `rank` waits for, or nullopt if it can run now. Sub-actions run in order, so a
  // later sub-action may consume what an earlier one produced.
  std::optional<std::string> Blocker(size_t rank, const Action& entry) const {
    std::vector<const Action*> earlier;
    for (const Action* leaf : LeafActions(entry)) {
      if (auto why = LeafBlocker(rank, *leaf, earlier)) return why;
      earlier.push_back(leaf);
    }
    return std::nullopt;
  }

  // True if `stage` has run `type` for `mb`, or one of `earlier` (sub-actions of the same entry)
  // is that action.
  bool Ran(int stage, ActionType type, int mb, const std::vector<const Action*>& earlier) const {
    if (Done(stage, type, mb)) return true;
    for (const Action* a : earlier) {
      if (a->stage == stage && a->type == type && a->microbatch == mb) return true;
    }
    return false;
  }

  std::optional<std::string> LeafBlocker(size_t rank, const Action& leaf,
                                         const std::vector<const Action*>& earlier) const {
    const int s = leaf.stage;
    const int mb = leaf.microbatch.value_or(-1);
    const int r = static_cast<int>(rank);
    if (leaf.type == ActionType::kForward && s > 0) {
      if (stage_to_rank_[s - 1] == r) {
        if (Ran(s - 1, ActionType::kForward, mb, earlier)) return std::nullopt;
        return absl::StrCat(ActionName(s - 1, ActionType::kForward, mb), " on this rank");
      }
      if (Done(s - 1, ActionType::kSendF, mb)) return std::nullopt;
      return absl::StrCat(ActionName(s - 1, ActionType::kSendF, mb), " from rank ",
                          stage_to_rank_[s - 1]);
    }
    if (IsBackwardInputOrFull(leaf.type) && s < num_stages_ - 1) {
      if (stage_to_rank_[s + 1] == r) {
        if (Ran(s + 1, ActionType::kBackwardInput, mb, earlier) ||
            Ran(s + 1, ActionType::kFullBackward, mb, earlier)) {
          return std::nullopt;
        }
        return absl::StrCat(ActionName(s + 1, ActionType::kBackwardInput, mb), " or ",
                            ActionName(s + 1, ActionType::kFullBackward, mb), " on this rank");
      }
      if (Done(s + 1, ActionType::kSendB, mb)) return std::nullopt;
      return absl::StrCat(ActionName(s + 1, ActionType::kSendB, mb), " from rank ",
                          stage_to_rank_[s + 1]);
    }
    return std::nullopt;
  }

  absl::Status Deadlock() const {
    std::vector<std::string> lines;
    std::optional<size_t> first_blocked;
    for (size_t rank = 0; rank < order_.size(); ++rank) {
      if (next_[rank] >= order_[rank].size()) {
        lines.push_back(absl::StrCat("rank ", rank, " has finished"));
        continue;
      }
      if (!first_blocked.has_value()) first_blocked = rank;
      const Action& entry = *order_[rank][next_[rank]];
      lines.push_back(absl::StrCat("rank ", rank, " is blocked at step ", next_[rank], " on ",
                                   entry.ToString(), ", waiting for ",
                                   Blocker(rank, entry).value_or("?")));
    }
    absl::Status status = absl::InvalidArgumentError(
        absl::StrCat("deadlock: no rank can progress; ", absl::StrJoin(lines, "; "),
                     "\n\nFull pipeline schedule:\n", FormatGrid(order_)));
    return WithLocation(std::move(status), *first_blocked, next_[*first_blocked]);
  }

  const PipelineOrder& order_;
  const std::vector<int>& stage_to_rank_;
  const int num_stages_;
  internal::ActionTable<uint8_t> done_;  // leaves executed so far, on any rank
  std::vector<size_t> next_;
};

}  // namespace

absl::Status CheckComms(const PipelineOrder& order, const std::vector<int>& stage_to_rank,
                        int num_microbatches) {
  return CommChecker(order, stage_to_rank, num_microbatches).Run();
}

absl::Status CheckDeadlockFree(const PipelineOrder& order, const std::vector<int>& stage_to_rank,
                               int num_microbatches) {
  return DeadlockChecker(order, stage_to_rank, num_microbatches).Run();
}

}  // namespace stagecoach::schedule::internal
