// Simulate's input checks (simulator_checks.h).
#include "common/schedule/simulator_checks.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule::simulator_internal {
namespace {

absl::Status CheckCost(double value, const std::string& field) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("costs.", field, " must be finite and >= 0, got ", value));
}

absl::Status CheckStageCosts(const StageCosts& costs, const std::string& prefix) {
  RETURN_IF_ERROR(CheckCost(costs.forward, prefix + ".forward"));
  RETURN_IF_ERROR(CheckCost(costs.backward, prefix + ".backward"));
  RETURN_IF_ERROR(CheckCost(costs.backward_input, prefix + ".backward_input"));
  return CheckCost(costs.backward_weight, prefix + ".backward_weight");
}

absl::Status CheckPerStageSize(size_t size, const std::string& field, int num_stages) {
  if (size <= static_cast<size_t>(num_stages)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("costs.", field, " has ", size,
                                                 " entries, more than the ", num_stages,
                                                 " stages of the pipeline"));
}

// The rules one leaf must satisfy wherever it runs: ranges, placement, and for SEND/RECV a peer
// stage that exists on another rank.
absl::Status CheckLeaf(const Action& leaf, const Action& entry, size_t rank, size_t step,
                       const std::vector<int>& stage_to_rank, int num_microbatches) {
  const int num_stages = static_cast<int>(stage_to_rank.size());
  const std::string name = DescribeLeaf(leaf, entry);
  if (&leaf != &entry && !IsLeafCompute(leaf.type)) {
    return AtStep(rank, step,
                  absl::StrCat(entry.ToString(), " overlaps ", leaf.ToString(),
                               "; OVERLAP_F_B may only contain F, I, B and W"));
  }
  const int s = leaf.stage;
  if (s < 0 || s >= num_stages) {
    return AtStep(
        rank, step,
        absl::StrCat("action ", name, " names stage ", s, ", outside [0, ", num_stages, ")"));
  }
  if (HasMicrobatch(leaf.type)) {
    const int mb = leaf.microbatch.value_or(-1);
    if (mb < 0 || mb >= num_microbatches) {
      return AtStep(rank, step,
                    absl::StrCat("action ", name, " names microbatch ", mb, ", outside [0, ",
                                 num_microbatches, ")"));
    }
  }
  if (stage_to_rank[s] != static_cast<int>(rank)) {
    return AtStep(
        rank, step,
        absl::StrCat("action ", name, " of stage ", s, " is on rank ", rank,
                     ", but stage_to_rank maps stage ", s, " to rank ", stage_to_rank[s]));
  }
  int peer = -1;
  switch (leaf.type) {
    case ActionType::kSendF:
    case ActionType::kRecvB:
      peer = s + 1;
      break;
    case ActionType::kRecvF:
    case ActionType::kSendB:
      peer = s - 1;
      break;
    default:
      return absl::OkStatus();
  }
  if (peer < 0 || peer >= num_stages) {
    return AtStep(
        rank, step,
        absl::StrCat(name, " exchanges a tensor with stage ", peer, ", which does not exist"));
  }
  if (stage_to_rank[peer] == static_cast<int>(rank)) {
    return AtStep(rank, step,
                  absl::StrCat(name, ": stages ", s, " and ", peer, " are both on rank ", rank,
                               ", which exchange tensors without send/recv"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCostModel(const CostModel& costs, int num_stages) {
  RETURN_IF_ERROR(CheckStageCosts(costs.defaults, "defaults"));
  RETURN_IF_ERROR(CheckPerStageSize(costs.per_stage.size(), "per_stage", num_stages));
  for (size_t s = 0; s < costs.per_stage.size(); ++s) {
    RETURN_IF_ERROR(CheckStageCosts(costs.per_stage[s], absl::StrCat("per_stage[", s, "]")));
  }
  RETURN_IF_ERROR(CheckCost(costs.unshard, "unshard"));
  RETURN_IF_ERROR(CheckCost(costs.reshard, "reshard"));
  RETURN_IF_ERROR(CheckCost(costs.reduce_grad, "reduce_grad"));
  RETURN_IF_ERROR(CheckCost(costs.latency, "latency"));
  RETURN_IF_ERROR(CheckCost(costs.bandwidth, "bandwidth"));
  RETURN_IF_ERROR(CheckCost(costs.message_bytes, "message_bytes"));
  RETURN_IF_ERROR(CheckPerStageSize(costs.per_stage_message_bytes.size(), "per_stage_message_bytes",
                                    num_stages));
  for (size_t s = 0; s < costs.per_stage_message_bytes.size(); ++s) {
    RETURN_IF_ERROR(CheckCost(costs.per_stage_message_bytes[s],
                              absl::StrCat("per_stage_message_bytes[", s, "]")));
  }
  for (const auto& [values, name] : {std::pair<const std::vector<double>*, const char*>{
                                         &costs.per_stage_unshard, "per_stage_unshard"},
                                     {&costs.per_stage_reduce_grad, "per_stage_reduce_grad"},
                                     {&costs.per_stage_after_step, "per_stage_after_step"}}) {
    RETURN_IF_ERROR(CheckPerStageSize(values->size(), name, num_stages));
    for (size_t s = 0; s < values->size(); ++s) {
      RETURN_IF_ERROR(CheckCost((*values)[s], absl::StrCat(name, "[", s, "]")));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const PipelineOrder& lowered, const std::vector<int>& stage_to_rank,
                        int num_stages, int num_microbatches) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages must be at least 1, got ", num_stages));
  }
  if (num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_microbatches must be at least 1, got ", num_microbatches));
  }
  if (static_cast<int>(stage_to_rank.size()) != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage_to_rank has ", stage_to_rank.size(),
                                                   " entries, expected one per stage (", num_stages,
                                                   ")"));
  }
  for (int s = 0; s < num_stages; ++s) {
    if (stage_to_rank[s] < 0 || stage_to_rank[s] >= static_cast<int>(lowered.size())) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", s, " is mapped to rank ",
                                                     stage_to_rank[s], ", but the schedule has ",
                                                     lowered.size(), " ranks"));
    }
  }
  return absl::OkStatus();
}

absl::Status AtStep(size_t rank, size_t step, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ", step ", step, ": ", what));
}

absl::Status CheckActions(const PipelineOrder& lowered, const std::vector<int>& stage_to_rank,
                          int num_microbatches) {
  for (size_t rank = 0; rank < lowered.size(); ++rank) {
    for (size_t step = 0; step < lowered[rank].size(); ++step) {
      if (!lowered[rank][step].has_value()) continue;
      const Action& entry = *lowered[rank][step];
      for (const Action* leaf : LeafActions(entry)) {
        RETURN_IF_ERROR(CheckLeaf(*leaf, entry, rank, step, stage_to_rank, num_microbatches));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::schedule::simulator_internal
