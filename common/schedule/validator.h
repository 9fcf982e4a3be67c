// Schedule validation: PyTorch's _validate_schedule rules for compute schedules, plus
// send/recv pairing and deadlock-freedom for lowered (compute + comms) schedules, and PyTorch's
// text grid used in error messages. Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/schedule/action.h"

namespace stagecoach::schedule {

// What a schedule is checked against.
struct ValidationOptions {
  // False for forward-only (inference) schedules: every stage runs F for each microbatch, and
  // B, I, W and REDUCE_GRAD are errors.
  bool has_backward = true;
  // ValidateLoweredSchedule only: the stages' parameters live sharded (placement.shard:
  // parameters), so per stage UNSHARD and RESHARD alternate, starting with UNSHARD and ending
  // with RESHARD, and every F, I, B and W of a stage runs between an UNSHARD and its RESHARD.
  bool sharded_parameters = false;
};

// Checks a compute schedule (F, I, B, W, OVERLAP_F_B, idle slots, and the per-stage UNSHARD,
// RESHARD and REDUCE_GRAD) and returns the stage-to-rank map it implies (element s = rank of
// stage s). Actions are processed rank by rank, step by step (PyTorch's order); the rules:
//  - there are exactly num_ranks rows;
//  - stage indices lie in [0, num_stages) and microbatch indices in [0, num_microbatches);
//  - B and I of (stage, mb) come after its F, W after its I; OVERLAP_F_B sub-actions are checked
//    one by one (only F, I, B and W may be overlapped);
//  - each stage appears on exactly one rank;
//  - per stage the distinct F microbatches number num_microbatches, count(I) == count(W), and
//    B + (I + W) / 2 == num_microbatches (without backward: no B, I, W or REDUCE_GRAD at all).
// Stricter than PyTorch: an action running twice for the same (stage, mb), B and I for the same
// (stage, mb), REDUCE_GRAD before the stage's last backward or twice, and SEND/RECV actions (use
// ValidateLoweredSchedule) are errors.
// Linear in the number of actions (state is kept in dense per-(stage, microbatch) tables).
// Errors are INVALID_ARGUMENT. Where a step is at fault the message starts
// "Rank R, step T: ..." naming the action (PyTorch's wording for PyTorch's rules), then
// "\n\nFull pipeline schedule:\n" and FormatGrid() with the step marked.
absl::StatusOr<std::vector<int>> ValidateComputeSchedule(const PipelineOrder& order, int num_ranks,
                                                         int num_stages, int num_microbatches,
                                                         const ValidationOptions& options = {});

// Checks a lowered schedule (compute and comms; idle slots are allowed and ignored) against
// `stage_to_rank` (one entry per stage). On top of the compute rules (on the compute actions,
// with the given map, steps counted in the lowered lists):
//  - every action of stage s is on rank stage_to_rank[s];
//  - SEND_F(s, mb) and RECV_F(s+1, mb) (SEND_B(s, mb) and RECV_B(s-1, mb)) pair one to one, and
//    exist only between stages on different ranks;
//  - a SEND comes after the compute that produces its tensor (F for SEND_F, I or B for SEND_B);
//  - a compute action that consumes a tensor from another rank (F of s > 0 whose stage s-1 is
//    remote; I or B of s < last whose stage s+1 is remote) comes after its RECV on its rank;
//  - the lists cannot deadlock: executing them with non-blocking SEND and RECV (a posted receive),
//    where a consuming compute action waits until the peer has executed the matching SEND (or,
//    for a local producer, until this rank has run it), every rank reaches its end. Otherwise the
//    error lists each rank's blocked action and what it waits for.
// Errors are INVALID_ARGUMENT, formatted as for ValidateComputeSchedule.
absl::Status ValidateLoweredSchedule(const PipelineOrder& lowered,
                                     const std::vector<int>& stage_to_rank, int num_stages,
                                     int num_microbatches, const ValidationOptions& options = {});

// The place in a schedule a validation error points at: a rank (row) and, when one action is at
// fault, its step (index in the rank's list, idle slots included). Errors about a whole stage
// point at the stage's rank only; errors about the schedule as a whole carry no location.
struct ScheduleErrorLocation {
  int rank = 0;
  std::optional<int> step;
};

// The location attached to an error returned by ValidateComputeSchedule or
// ValidateLoweredSchedule (a deadlock points at the first blocked rank's blocked action), or
// nullopt.
std::optional<ScheduleErrorLocation> ErrorLocation(const absl::Status& status);

// PyTorch's _format_pipeline_order: a header row of "Rank i" labels, then one row per step
// ("Step 07: " with the step number zero-padded to the width of the last one) and one
// left-aligned column per rank; idle slots and missing entries print as blanks; columns are
// separated by one space and every line is padded to the full width. A column's width is the
// longer of its longest action and the step label ("Step 07"). With `error_step`, that row ends
// with " <-- ERROR HERE". Every line ends with "\n"; a schedule without steps prints the header
// only.
std::string FormatGrid(const PipelineOrder& order, std::optional<int> error_step = std::nullopt);

}  // namespace stagecoach::schedule
