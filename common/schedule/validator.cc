#include "common/schedule/validator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/schedule/action_table.h"
#include "common/schedule/validator_parts.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule {
namespace {

using internal::ActionName;
using internal::Reporter;
using internal::WithLocation;

constexpr absl::string_view kLocationPayload = "type.stagecoach.dev/schedule-error-location";

// PyTorch's _validate_schedule rules (and our stricter ones) over the compute actions of `order`.
// In lowered mode SEND/RECV actions are allowed (their own rules live in CheckComms) and
// `expected_stage_to_rank` fixes where every stage must run.
class ComputeChecker {
 public:
  ComputeChecker(const PipelineOrder& order, int num_stages, int num_microbatches,
                 const std::vector<int>* expected_stage_to_rank, bool has_backward,
                 bool sharded = false)
      : order_(order),
        report_(order),
        num_stages_(num_stages),
        num_microbatches_(num_microbatches),
        expected_(expected_stage_to_rank),
        has_backward_(has_backward),
        sharded_(sharded),
        stages_(num_stages),
        done_(num_stages, num_microbatches, 0),
        stage_to_rank_(num_stages, -1) {}

  absl::StatusOr<std::vector<int>> Run() {
    for (size_t rank = 0; rank < order_.size(); ++rank) {
      for (size_t step = 0; step < order_[rank].size(); ++step) {
        if (!order_[rank][step].has_value()) continue;
        const Action& entry = *order_[rank][step];
        for (const Action* leaf : LeafActions(entry)) {
          absl::Status status = Process(*leaf, entry, rank, step);
          if (!status.ok()) return status;
        }
      }
    }
    for (int s = 0; s < num_stages_; ++s) {
      const StageState& st = stages_[s];
      const int f = st.f, b = st.b, i = st.i, w = st.w;
      if (sharded_ && st.unsharded) {
        return report_.Whole(absl::StrCat("Stage ", s,
                                          "'s parameters are still gathered at the end of the "
                                          "step (no RESHARD after its last UNSHARD)"),
                             stage_to_rank_[s]);
      }
      if (f != num_microbatches_) {
        return report_.Whole(absl::StrCat("Got ", f, " F microbatches for stage ", s, ", expected ",
                                          num_microbatches_),
                             stage_to_rank_[s]);
      }
      if (i != w) {
        return report_.Whole(
            absl::StrCat("Invalid backward microbatches for stage ", s,
                         ": I and W must have equal counts, but got I=", i, ", W=", w),
            stage_to_rank_[s]);
      }
      if (!has_backward_) continue;  // backward actions were refused in Process
      if (b + (i + w) / 2 != num_microbatches_) {
        return report_.Whole(absl::StrCat("Invalid backward microbatches for stage ", s,
                                          ": expected ", num_microbatches_,
                                          " total backwards, but got B=", b, ", I=", i, ", W=", w),
                             stage_to_rank_[s]);
      }
    }
    return stage_to_rank_;
  }

 private:
  // Counts of distinct microbatches per type; which microbatches ran is in done_.
  struct StageState {
    int f = 0, b = 0, i = 0, w = 0;
    int backwards_done = 0;  // B and W so far
    bool reduced = false;
    bool unsharded = false;  // between an UNSHARD and the next RESHARD
  };

  // With sharded parameters: UNSHARD and RESHARD alternate per stage, and compute runs between
  // them.
  absl::Status CheckSharding(const Action& leaf, const std::string& name, size_t rank,
                             size_t step) {
    StageState& st = stages_[leaf.stage];
    if (leaf.type == ActionType::kUnshard || leaf.type == ActionType::kReshard) {
      const bool unshard = leaf.type == ActionType::kUnshard;
      if (st.unsharded == unshard) {
        return report_.AtStep(
            rank, step,
            absl::StrCat(name, ": stage ", leaf.stage, "'s parameters are ",
                         unshard ? "gathered already (UNSHARD twice without a RESHARD)"
                                 : "not gathered (RESHARD without an UNSHARD)"));
      }
      st.unsharded = unshard;
    } else if (IsLeafCompute(leaf.type) && !st.unsharded) {
      return report_.AtStep(rank, step,
                            absl::StrCat(name, " runs while stage ", leaf.stage,
                                         "'s parameters are sharded (no UNSHARD before it since "
                                         "the stage's last RESHARD)"));
    }
    return absl::OkStatus();
  }

  bool Done(ActionType type, int stage, int mb) const { return done_(type, stage, mb) != 0; }

  absl::Status Process(const Action& leaf, const Action& entry, size_t rank, size_t step) {
    const std::string name = DescribeLeaf(leaf, entry);
    if (&leaf != &entry && !IsLeafCompute(leaf.type)) {
      return report_.AtStep(rank, step,
                            absl::StrCat(entry.ToString(), " overlaps ", leaf.ToString(),
                                         "; OVERLAP_F_B may only contain F, I, B and W"));
    }
    if (expected_ == nullptr && IsSendOrRecv(leaf.type)) {
      return report_.AtStep(rank, step,
                            absl::StrCat("communication action ", name,
                                         " in a compute schedule (validate lowered schedules "
                                         "with ValidateLoweredSchedule)"));
    }
    const int s = leaf.stage;
    if (s < 0 || s >= num_stages_) {
      return report_.AtStep(
          rank, step,
          absl::StrCat("action ", name, " names stage ", s, ", outside [0, ", num_stages_, ")"));
    }
    const int mb = leaf.microbatch.value_or(0);
    if (leaf.microbatch.has_value() && (mb < 0 || mb >= num_microbatches_)) {
      return report_.AtStep(rank, step,
                            absl::StrCat("action ", name, " names microbatch ", mb,
                                         ", outside [0, ", num_microbatches_, ")"));
    }
    StageState& st = stages_[s];
    auto twice = [&](absl::string_view what) {
      return report_.AtStep(rank, step,
                            absl::StrCat(what, " for stage ", s, ", microbatch ", mb, " (", name,
                                         ") runs a second time"));
    };
    if (sharded_) {
      absl::Status sharding = CheckSharding(leaf, name, rank, step);
      if (!sharding.ok()) return sharding;
    }
    const bool backward =
        leaf.type == ActionType::kFullBackward || leaf.type == ActionType::kBackwardInput ||
        leaf.type == ActionType::kBackwardWeight || leaf.type == ActionType::kReduceGrad;
    if (backward && !has_backward_) {
      return report_.AtStep(
          rank, step, absl::StrCat(name, " in a forward-only schedule, which has no backward"));
    }
    switch (leaf.type) {
      case ActionType::kForward:
        if (Done(ActionType::kForward, s, mb)) return twice("Forward");
        done_(ActionType::kForward, s, mb) = 1;
        ++st.f;
        break;
      case ActionType::kFullBackward:
        if (!Done(ActionType::kForward, s, mb)) {
          return report_.AtStep(rank, step,
                                absl::StrCat("Running Full Backward for stage ", s, ", microbatch ",
                                             mb, " without first running Forward"));
        }
        if (Done(ActionType::kFullBackward, s, mb)) return twice("Full Backward");
        if (Done(ActionType::kBackwardInput, s, mb)) {
          return report_.AtStep(rank, step,
                                absl::StrCat("Full Backward for stage ", s, ", microbatch ", mb,
                                             " (", name, ") after its Backward Input already ran"));
        }
        done_(ActionType::kFullBackward, s, mb) = 1;
        ++st.b;
        ++st.backwards_done;
        break;
      case ActionType::kBackwardInput:
        if (!Done(ActionType::kForward, s, mb)) {
          return report_.AtStep(
              rank, step,
              absl::StrCat("Running Backward Input for stage ", s, ", microbatch ", mb,
                           " without first running Forward"));
        }
        if (Done(ActionType::kBackwardInput, s, mb)) return twice("Backward Input");
        if (Done(ActionType::kFullBackward, s, mb)) {
          return report_.AtStep(rank, step,
                                absl::StrCat("Backward Input for stage ", s, ", microbatch ", mb,
                                             " (", name, ") after its Full Backward already ran"));
        }
        done_(ActionType::kBackwardInput, s, mb) = 1;
        ++st.i;
        break;
      case ActionType::kBackwardWeight:
        if (!Done(ActionType::kBackwardInput, s, mb)) {
          return report_.AtStep(
              rank, step,
              absl::StrCat("Running Backward Weight for stage ", s, ", microbatch ", mb,
                           " without first running Backward Input"));
        }
        if (Done(ActionType::kBackwardWeight, s, mb)) return twice("Backward Weight");
        done_(ActionType::kBackwardWeight, s, mb) = 1;
        ++st.w;
        ++st.backwards_done;
        break;
      case ActionType::kReduceGrad:
        if (st.reduced) {
          return report_.AtStep(rank, step,
                                absl::StrCat(name, " runs a second time for stage ", s));
        }
        if (st.backwards_done < num_microbatches_) {
          return report_.AtStep(
              rank, step,
              absl::StrCat(name, " runs before the last backward of stage ", s, " (",
                           st.backwards_done, " of ", num_microbatches_, " B/W done)"));
        }
        st.reduced = true;
        break;
      default:
        break;
    }
    const int r = static_cast<int>(rank);
    if (expected_ != nullptr && (*expected_)[s] != r) {
      return report_.AtStep(
          rank, step,
          absl::StrCat("action ", name, " of stage ", s, " is on rank ", r,
                       ", but stage_to_rank maps stage ", s, " to rank ", (*expected_)[s]));
    }
    if (stage_to_rank_[s] == -1) {
      stage_to_rank_[s] = r;
    } else if (stage_to_rank_[s] != r) {
      return report_.AtStep(rank, step,
                            absl::StrCat("Stage ", s, " is assigned to both rank ", r, " and rank ",
                                         stage_to_rank_[s], " (", name, ")"));
    }
    return absl::OkStatus();
  }

  const PipelineOrder& order_;
  const Reporter report_;
  const int num_stages_;
  const int num_microbatches_;
  const std::vector<int>* expected_;
  const bool has_backward_;
  const bool sharded_;
  std::vector<StageState> stages_;
  internal::ActionTable<uint8_t> done_;
  std::vector<int> stage_to_rank_;
};

absl::Status CheckCounts(int num_ranks, int num_stages, int num_microbatches) {
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_ranks must be at least 1, got ", num_ranks));
  }
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages must be at least 1, got ", num_stages));
  }
  if (num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_microbatches must be at least 1, got ", num_microbatches));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

std::string ActionName(int stage, ActionType type, int mb) {
  return Action::Make(stage, type, mb).ToString();
}

absl::Status WithLocation(absl::Status status, size_t rank, std::optional<size_t> step) {
  status.SetPayload(kLocationPayload, absl::Cord(step.has_value() ? absl::StrCat(rank, ",", *step)
                                                                  : absl::StrCat(rank)));
  return status;
}

}  // namespace internal

absl::StatusOr<std::vector<int>> ValidateComputeSchedule(const PipelineOrder& order, int num_ranks,
                                                         int num_stages, int num_microbatches,
                                                         const ValidationOptions& options) {
  absl::Status status = CheckCounts(num_ranks, num_stages, num_microbatches);
  if (!status.ok()) return status;
  if (static_cast<int>(order.size()) != num_ranks) {
    return Reporter(order).Whole(absl::StrCat("Schedule has incorrect number of ranks - expected ",
                                              num_ranks, ", actual ", order.size()));
  }
  return ComputeChecker(order, num_stages, num_microbatches, nullptr, options.has_backward).Run();
}

absl::Status ValidateLoweredSchedule(const PipelineOrder& lowered,
                                     const std::vector<int>& stage_to_rank, int num_stages,
                                     int num_microbatches, const ValidationOptions& options) {
  const int num_ranks = static_cast<int>(lowered.size());
  absl::Status status = CheckCounts(num_ranks, num_stages, num_microbatches);
  if (!status.ok()) return status;
  if (static_cast<int>(stage_to_rank.size()) != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage_to_rank has ", stage_to_rank.size(),
                                                   " entries, expected one per stage (", num_stages,
                                                   ")"));
  }
  for (int s = 0; s < num_stages; ++s) {
    if (stage_to_rank[s] < 0 || stage_to_rank[s] >= num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", s, " is mapped to rank ",
                                                     stage_to_rank[s], ", but the schedule has ",
                                                     num_ranks, " ranks"));
    }
  }
  auto inferred = ComputeChecker(lowered, num_stages, num_microbatches, &stage_to_rank,
                                 options.has_backward, options.sharded_parameters)
                      .Run();
  if (!inferred.ok()) return inferred.status();
  status = internal::CheckComms(lowered, stage_to_rank, num_microbatches);
  if (!status.ok()) return status;
  return internal::CheckDeadlockFree(lowered, stage_to_rank, num_microbatches);
}

std::optional<ScheduleErrorLocation> ErrorLocation(const absl::Status& status) {
  auto payload = status.GetPayload(kLocationPayload);
  if (!payload.has_value()) return std::nullopt;
  std::vector<std::string> parts = absl::StrSplit(std::string(*payload), ',');
  ScheduleErrorLocation location;
  if (parts.empty() || !absl::SimpleAtoi(parts[0], &location.rank)) return std::nullopt;
  int step = 0;
  if (parts.size() > 1 && absl::SimpleAtoi(parts[1], &step)) location.step = step;
  return location;
}

std::string FormatGrid(const PipelineOrder& order, std::optional<int> error_step) {
  size_t num_steps = 0;
  for (const RankActions& actions : order) num_steps = std::max(num_steps, actions.size());
  const size_t digits = num_steps > 1 ? std::to_string(num_steps - 1).size() : 1;
  const size_t label_width = 5 + digits;  // "Step " and the zero-padded number

  std::vector<std::vector<std::string>> cells(order.size());
  std::vector<size_t> widths(order.size(), label_width);
  for (size_t rank = 0; rank < order.size(); ++rank) {
    for (const std::optional<Action>& action : order[rank]) {
      cells[rank].push_back(action.has_value() ? action->ToString() : "");
      widths[rank] = std::max(widths[rank], cells[rank].back().size());
    }
  }
  auto pad = [](std::string text, size_t width) {
    if (text.size() < width) text.append(width - text.size(), ' ');
    return text;
  };

  std::string out(label_width + 2, ' ');
  for (size_t rank = 0; rank < order.size(); ++rank) {
    if (rank > 0) out += ' ';
    out += pad(absl::StrCat("Rank ", rank), widths[rank]);
  }
  out += '\n';
  for (size_t step = 0; step < num_steps; ++step) {
    std::string number = std::to_string(step);
    out += absl::StrCat("Step ", std::string(digits - number.size(), '0'), number, ": ");
    for (size_t rank = 0; rank < order.size(); ++rank) {
      if (rank > 0) out += ' ';
      out += pad(step < cells[rank].size() ? cells[rank][step] : "", widths[rank]);
    }
    if (error_step.has_value() && static_cast<size_t>(*error_step) == step) {
      out += " <-- ERROR HERE";
    }
    out += '\n';
  }
  return out;
}

}  // namespace stagecoach::schedule
