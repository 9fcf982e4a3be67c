#include "common/schedule/lowering.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagecoach::schedule {
namespace {

// (stage, type, microbatch or -1): what a rank has already placed in its list.
using Key = std::tuple<int, ActionType, int>;

Key KeyOf(int stage, ActionType type, int mb) { return Key{stage, type, mb}; }

class SendRecvInserter {
 public:
  SendRecvInserter(const PipelineOrder& compute, const std::vector<int>& stage_to_rank,
                   int num_stages)
      : compute_(compute),
        stage_to_rank_(stage_to_rank),
        num_stages_(num_stages),
        out_(compute.size()),
        placed_(compute.size()) {}

  absl::StatusOr<PipelineOrder> Run() {
    std::vector<size_t> next(compute_.size(), 0);
    auto pending = [&](size_t rank) { return next[rank] < compute_[rank].size(); };
    while (true) {
      bool any_pending = false;
      bool progress = false;
      for (size_t rank = 0; rank < compute_.size(); ++rank) {
        // Idle slots are skipped outright rather than spending a round.
        while (pending(rank) && !compute_[rank][next[rank]].has_value()) ++next[rank];
        if (!pending(rank)) continue;
        any_pending = true;
        const Action& head = *compute_[rank][next[rank]];
        bool ready = true;
        for (const Action* leaf : LeafActions(head)) {
          if (MissingInput(*leaf, rank).has_value()) ready = false;
        }
        if (!ready) continue;
        Place(head, rank);
        ++next[rank];
        progress = true;
      }
      if (!any_pending) break;
      if (!progress) return Stuck(next);
    }
    return std::move(out_);
  }

 private:
  bool Has(size_t rank, int stage, ActionType type, int mb) const {
    return placed_[rank].count(KeyOf(stage, type, mb)) > 0;
  }

  // True if `leaf` produces a tensor for a stage on another rank (PyTorch's _has_comms).
  bool CrossesRanks(const Action& leaf) const {
    if (leaf.type == ActionType::kForward) {
      return leaf.stage != num_stages_ - 1 &&
             stage_to_rank_[leaf.stage + 1] != stage_to_rank_[leaf.stage];
    }
    if (IsBackwardInputOrFull(leaf.type)) {
      return leaf.stage != 0 && stage_to_rank_[leaf.stage - 1] != stage_to_rank_[leaf.stage];
    }
    return false;
  }

  // Why `leaf` cannot be placed on `rank` yet, or nullopt if it can.
  std::optional<std::string> MissingInput(const Action& leaf, size_t rank) const {
    const int s = leaf.stage;
    const int mb = leaf.microbatch.value_or(-1);
    if (leaf.type == ActionType::kForward && s != 0) {
      if (Has(rank, s, ActionType::kRecvF, mb) || Has(rank, s - 1, ActionType::kForward, mb)) {
        return std::nullopt;
      }
      return absl::StrCat(Action::Make(s, ActionType::kRecvF, mb).ToString(), " (sent after ",
                          Action::Make(s - 1, ActionType::kForward, mb).ToString(), " on rank ",
                          stage_to_rank_[s - 1], ")");
    }
    if (IsBackwardInputOrFull(leaf.type) && s != num_stages_ - 1) {
      if (Has(rank, s, ActionType::kRecvB, mb) ||
          Has(rank, s + 1, ActionType::kBackwardInput, mb) ||
          Has(rank, s + 1, ActionType::kFullBackward, mb)) {
        return std::nullopt;
      }
      return absl::StrCat(Action::Make(s, ActionType::kRecvB, mb).ToString(), " (sent after ",
                          Action::Make(s + 1, ActionType::kBackwardInput, mb).ToString(), " or ",
                          Action::Make(s + 1, ActionType::kFullBackward, mb).ToString(),
                          " on rank ", stage_to_rank_[s + 1], ")");
    }
    return std::nullopt;
  }

  void Record(size_t rank, const Action& action) {
    placed_[rank].insert(KeyOf(action.stage, action.type, action.microbatch.value_or(-1)));
  }

  void Place(const Action& action, size_t rank) {
    out_[rank].push_back(action);
    for (const Action* leaf : LeafActions(action)) {
      Record(rank, *leaf);
      if (!CrossesRanks(*leaf)) continue;
      const bool forward = leaf->type == ActionType::kForward;
      Action send = Action::Make(leaf->stage, forward ? ActionType::kSendF : ActionType::kSendB,
                                 leaf->microbatch);
      Action recv =
          Action::Make(forward ? leaf->stage + 1 : leaf->stage - 1,
                       forward ? ActionType::kRecvF : ActionType::kRecvB, leaf->microbatch);
      const size_t peer = static_cast<size_t>(stage_to_rank_[recv.stage]);
      out_[rank].push_back(send);
      Record(rank, send);
      out_[peer].push_back(recv);
      Record(peer, recv);
    }
  }

  absl::Status Stuck(const std::vector<size_t>& next) const {
    std::vector<std::string> lines;
    for (size_t rank = 0; rank < compute_.size(); ++rank) {
      if (next[rank] >= compute_[rank].size()) {
        lines.push_back(absl::StrCat("rank ", rank, " has finished"));
        continue;
      }
      const Action& head = *compute_[rank][next[rank]];
      std::vector<std::string> missing;
      for (const Action* leaf : LeafActions(head)) {
        if (auto why = MissingInput(*leaf, rank)) {
          missing.push_back(absl::StrCat(leaf->ToString(), " needs ", *why));
        }
      }
      lines.push_back(absl::StrCat("rank ", rank, " is stuck at step ", next[rank], " on ",
                                   head.ToString(), ": ", absl::StrJoin(missing, "; ")));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed compute schedule, can't schedule sends/recvs: no rank can progress (",
        absl::StrJoin(lines, "; "), ")"));
  }

  const PipelineOrder& compute_;
  const std::vector<int>& stage_to_rank_;
  const int num_stages_;
  PipelineOrder out_;
  std::vector<std::set<Key>> placed_;
};

absl::Status CheckInputs(const PipelineOrder& compute, const std::vector<int>& stage_to_rank,
                         int num_stages) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages must be at least 1, got ", num_stages));
  }
  if (static_cast<int>(stage_to_rank.size()) != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage_to_rank has ", stage_to_rank.size(),
                                                   " entries, expected one per stage (", num_stages,
                                                   ")"));
  }
  for (int stage = 0; stage < num_stages; ++stage) {
    if (stage_to_rank[stage] < 0 || stage_to_rank[stage] >= static_cast<int>(compute.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", stage, " is mapped to rank ", stage_to_rank[stage],
                       ", but the schedule has ", compute.size(), " ranks"));
    }
  }
  for (size_t rank = 0; rank < compute.size(); ++rank) {
    for (size_t step = 0; step < compute[rank].size(); ++step) {
      if (!compute[rank][step].has_value()) continue;
      for (const Action* leaf : LeafActions(*compute[rank][step])) {
        if (leaf->stage < 0 || leaf->stage >= num_stages) {
          return absl::InvalidArgumentError(
              absl::StrCat("rank ", rank, ", step ", step, ": action ", leaf->ToString(),
                           " names stage ", leaf->stage, ", outside [0, ", num_stages, ")"));
        }
        if (stage_to_rank[leaf->stage] != static_cast<int>(rank)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", rank, ", step ", step, ": action ", leaf->ToString(), " is on rank ", rank,
              ", but stage ", leaf->stage, " is mapped to rank ", stage_to_rank[leaf->stage]));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

RankActions AddReduceGrad(const RankActions& actions, int num_microbatches) {
  RankActions out;
  std::map<int, int> backwards;  // stage -> B and W seen so far
  for (const std::optional<Action>& action : actions) {
    if (!action.has_value()) continue;
    out.push_back(action);
    for (const Action* leaf : LeafActions(*action)) {
      if (leaf->type != ActionType::kFullBackward && leaf->type != ActionType::kBackwardWeight) {
        continue;
      }
      if (++backwards[leaf->stage] == num_microbatches) {
        out.push_back(Action::Make(leaf->stage, ActionType::kReduceGrad));
      }
    }
  }
  return out;
}

absl::StatusOr<PipelineOrder> AddSendRecv(const PipelineOrder& compute,
                                          const std::vector<int>& stage_to_rank, int num_stages) {
  absl::Status status = CheckInputs(compute, stage_to_rank, num_stages);
  if (!status.ok()) return status;
  return SendRecvInserter(compute, stage_to_rank, num_stages).Run();
}

RankActions AddUnshardReshard(const RankActions& actions, int max_active_stages) {
  (void)max_active_stages;
  return actions;  // TODO(lowering): implement
}

RankActions MergeBackward(const RankActions& actions) {
  return actions;  // TODO(lowering): implement
}

absl::StatusOr<PipelineOrder> LowerSchedule(const PipelineOrder& compute,
                                            const std::vector<int>& stage_to_rank, int num_stages,
                                            int num_microbatches,
                                            const LoweringOptions& options) {
  PipelineOrder per_rank(compute.size());
  for (size_t rank = 0; rank < compute.size(); ++rank) {
    RankActions actions;
    for (const auto& action : compute[rank]) {
      if (action.has_value() && action->type == ActionType::kReduceGrad) continue;
      actions.push_back(action);
    }
    if (options.max_active_stages > 0) {
      actions = AddUnshardReshard(actions, options.max_active_stages);
    }
    per_rank[rank] = AddReduceGrad(actions, num_microbatches);
  }
  return AddSendRecv(per_rank, stage_to_rank, num_stages);
}

}  // namespace stagecoach::schedule
