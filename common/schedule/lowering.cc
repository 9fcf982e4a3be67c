#include "common/schedule/lowering.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/action_table.h"

namespace stagecoach::schedule {
namespace {

// One more than the largest microbatch index in `order` (0 if there is none).
int MicrobatchBound(const PipelineOrder& order) {
  int bound = 0;
  for (const RankActions& actions : order) {
    for (const std::optional<Action>& action : actions) {
      if (!action.has_value()) continue;
      for (const Action* leaf : LeafActions(*action)) {
        if (leaf->microbatch.has_value()) bound = std::max(bound, *leaf->microbatch + 1);
      }
    }
  }
  return bound;
}

class SendRecvInserter {
 public:
  SendRecvInserter(const PipelineOrder& compute, const std::vector<int>& stage_to_rank,
                   int num_stages)
      : compute_(compute),
        stage_to_rank_(stage_to_rank),
        num_stages_(num_stages),
        out_(compute.size()),
        placed_(num_stages, MicrobatchBound(compute), 0) {}

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
  // Whether `rank`'s output already holds (stage, type, mb). Every action of a stage sits on that
  // stage's rank (CheckInputs), so one table serves all ranks.
  bool Has(size_t rank, int stage, ActionType type, int mb) const {
    return stage_to_rank_[stage] == static_cast<int>(rank) && placed_.InRange(stage, mb) &&
           placed_(type, stage, mb) != 0;
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

  void Record(const Action& action) {
    if (action.microbatch.has_value()) placed_[action] = 1;
  }

  void Place(const Action& action, size_t rank) {
    out_[rank].push_back(action);
    for (const Action* leaf : LeafActions(action)) {
      Record(*leaf);
      if (!CrossesRanks(*leaf)) continue;
      const bool forward = leaf->type == ActionType::kForward;
      Action send = Action::Make(leaf->stage, forward ? ActionType::kSendF : ActionType::kSendB,
                                 leaf->microbatch);
      Action recv =
          Action::Make(forward ? leaf->stage + 1 : leaf->stage - 1,
                       forward ? ActionType::kRecvF : ActionType::kRecvB, leaf->microbatch);
      const size_t peer = static_cast<size_t>(stage_to_rank_[recv.stage]);
      out_[rank].push_back(send);
      Record(send);
      out_[peer].push_back(recv);
      Record(recv);
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
  internal::ActionTable<uint8_t> placed_;
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

// For each entry of one rank's list, PyTorch's next_stage_indices(count, entries[i:]): the first
// `count` distinct stages from entry i on in order of first appearance, where an entry's leaves
// are taken together (an OVERLAP_F_B that crosses `count` adds all its new stages).
//
// Computed from the back in one pass: `upcoming` holds the distinct stages from entry i on, in
// order of first appearance, each tagged with the entry it first appears at. Entry i's stages move
// to the front; stages of one entry stay adjacent, so the window is a prefix cut at an entry
// boundary.
std::vector<std::vector<int>> StageWindows(const std::vector<const Action*>& entries, int count) {
  struct Upcoming {
    int stage;
    size_t entry;
  };
  std::vector<Upcoming> upcoming;
  std::vector<std::vector<int>> windows(entries.size());
  for (size_t i = entries.size(); i-- > 0;) {
    std::vector<int> stages;
    for (const Action* leaf : LeafActions(*entries[i])) {
      if (std::find(stages.begin(), stages.end(), leaf->stage) == stages.end()) {
        stages.push_back(leaf->stage);
      }
    }
    upcoming.erase(std::remove_if(upcoming.begin(), upcoming.end(),
                                  [&](const Upcoming& u) {
                                    return std::find(stages.begin(), stages.end(), u.stage) !=
                                           stages.end();
                                  }),
                   upcoming.end());
    std::vector<Upcoming> front;
    for (int stage : stages) front.push_back({stage, i});
    upcoming.insert(upcoming.begin(), front.begin(), front.end());

    std::vector<int>& window = windows[i];
    for (size_t k = 0; k < upcoming.size(); ++k) {
      if (static_cast<int>(window.size()) >= count && upcoming[k].entry != upcoming[k - 1].entry) {
        break;
      }
      window.push_back(upcoming[k].stage);
    }
  }
  return windows;
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
  std::vector<const Action*> entries;
  for (const std::optional<Action>& action : actions) {
    if (action.has_value()) entries.push_back(&*action);
  }
  const std::vector<std::vector<int>> windows = StageWindows(entries, max_active_stages);

  RankActions out;
  std::vector<int> active;  // kept in increasing order
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::vector<int>& window = windows[i];
    auto in_window = [&](int stage) {
      return std::find(window.begin(), window.end(), stage) != window.end();
    };
    std::vector<int> still_active;
    for (int stage : active) {
      if (in_window(stage)) {
        still_active.push_back(stage);
      } else {
        out.push_back(Action::Make(stage, ActionType::kReshard));
      }
    }
    active = std::move(still_active);
    for (int stage : window) {
      auto at = std::lower_bound(active.begin(), active.end(), stage);
      if (at != active.end() && *at == stage) continue;
      active.insert(at, stage);
      out.push_back(Action::Make(stage, ActionType::kUnshard));
    }
    out.push_back(*entries[i]);
  }
  for (int stage : active) out.push_back(Action::Make(stage, ActionType::kReshard));
  return out;
}

int UnshardWindow(absl::string_view unshard, int num_stages) {
  if (unshard == "step") return std::max(num_stages, 1);
  if (unshard == "stage") return 2;
  return 0;
}

RankActions MergeBackward(const RankActions& actions) {
  std::vector<const Action*> entries;
  for (const std::optional<Action>& action : actions) {
    if (action.has_value()) entries.push_back(&*action);
  }
  RankActions out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Action& action = *entries[i];
    const Action* next = i + 1 < entries.size() ? entries[i + 1] : nullptr;
    if (action.type == ActionType::kBackwardInput && next != nullptr &&
        next->type == ActionType::kBackwardWeight && next->stage == action.stage &&
        next->microbatch == action.microbatch) {
      out.push_back(Action::Make(action.stage, ActionType::kFullBackward, action.microbatch));
      ++i;
      continue;
    }
    out.push_back(action);
  }
  return out;
}

absl::StatusOr<PipelineOrder> LowerSchedule(const PipelineOrder& compute,
                                            const std::vector<int>& stage_to_rank, int num_stages,
                                            int num_microbatches, const LoweringOptions& options) {
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
