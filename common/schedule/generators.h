// Schedule generators: the per-rank action lists of torch.distributed.pipelining's schedule
// classes, and the stage-to-rank mappings they assume.
//
// A generator is selected by ScheduleKind and parameterised by ScheduleConfig. Each kind produces
// PyTorch's `pipeline_order` for the same arguments (same names, same orders, same constraint
// errors), except where PyTorch's list is known to be defective; those differences are documented
// at the kind. Generators are pure functions: thread-safe, no I/O.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/action.h"

namespace stagecoach::schedule {

// The schedules this library can generate, under PyTorch's names.
enum class ScheduleKind {
  // Fill-drain: every rank runs all forwards, then all backwards. One stage per rank.
  kGPipe,
  // One-forward-one-backward: warm-up forwards, then alternating F/B, then cool-down backwards.
  // One stage per rank; needs num_microbatches >= number of stages.
  //
  // Differs from PyTorch on the last rank only: PyTorch's list there runs forwards F1..Fm
  // (skipping F0 and running one past the end) and fails PyTorch's own validator. Ours runs
  // F0,B0,F1,B1,... with the same idle-slot alignment; every other rank is identical.
  k1F1B,
  // Depth-first 1F1B over several loop-placed stages per rank (Megatron's interleaved schedule).
  // num_microbatches must be a multiple of the rounds, max(1, num_microbatches / num_ranks).
  kInterleaved1F1B,
  // Breadth-first: each local stage runs all microbatches before the next local stage.
  kLoopedBFS,
  // Interleaved 1F1B with the backward split into I and W, W filling the bubbles (ZB1P).
  // Same microbatch rule as kInterleaved1F1B.
  kInterleavedZeroBubble,
  // These three are identical to PyTorch, slots included. PyTorch's slots are not always a
  // timing: with fewer microbatches than ranks (and for Interleaved1F1B with a count that is not
  // a multiple of the ranks) an action can share a slot with the one whose output it needs, e.g.
  // Interleaved1F1B r2 s2 m1 puts 2F0 in the slot of 1F0. Each rank's order is valid and lowers
  // without deadlock; the lowering, validator and simulator use only that order.
  // Zero-bubble "V": exactly two stages per rank in "v" placement, backward split into I and W.
  // Any number of microbatches: below 2*num_ranks-1 the list is laid out for 2*num_ranks-1 and
  // the extra microbatches' actions are idle slots. Identical to PyTorch (valid and deadlock-free
  // for every config checked, up to 16 ranks and 64 microbatches).
  kZBVZeroBubble,
  // DeepSeek's DualPipe in "V" placement: two stages per rank, overlapped F/B pairs
  // (OVERLAP_F_B); needs num_microbatches >= number of stages. No idle slots. Identical to
  // PyTorch (valid and deadlock-free for every config checked, up to 16 ranks and 64
  // microbatches).
  kDualPipeV,
  // Not in PyTorch: "V" schedules with a bounded activation memory, after "Pipeline Parallelism
  // with Controllable Memory" (Qi et al., 2024), from our own budgeted list scheduler
  // (generators/controllable_v.cc). Two stages per rank in "v" placement, backward split into I
  // and W, any number of microbatches. Each rank holds at most 2*floor((p+2)/2) (VHalf) or
  // 2*floor((p+4)/3) (VMin) stage activations at once, against ZBVZeroBubble's 2p: about 1/2
  // and 1/3 of 1F1B's activation memory for large p, at the cost of more bubbles.
  kVHalf,
  kVMin,
  // Inference: forwards only, no backward (PyTorch's unregistered _ScheduleForwardOnly). Any
  // number of loop-placed stages per rank.
  kForwardOnly,
};

// Looks up a schedule by PyTorch's name, case-insensitively ("gpipe", "1F1B", "zbvzerobubble").
// INVALID_ARGUMENT naming the valid schedules for anything else, e.g. "unknown schedule
// 'ZeroBubble'; valid schedules: GPipe, 1F1B, ...". PyTorch's base classes
// PipelineScheduleSingle and PipelineScheduleMulti get an error saying they are not schedules.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);

// PyTorch's spelling of `kind` ("GPipe", "1F1B"); ParseScheduleKind accepts it.
absl::string_view ScheduleKindName(ScheduleKind kind);

// True for the kinds with a backward pass (all but kForwardOnly).
bool HasBackward(ScheduleKind kind);

// The stages per rank to use when none is given: 1 for GPipe, 1F1B and ForwardOnly, 2 for the
// others (ZBVZeroBubble and DualPipeV need exactly 2; 2 is PyTorch's visualiser default for the
// interleaved kinds).
int DefaultStagesPerRank(ScheduleKind kind);

// All kinds, in the order error messages list them.
const std::vector<ScheduleKind>& AllScheduleKinds();

// What to generate.
struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kGPipe;
  // Pipeline ranks (PyTorch's pp_group_size); >= 1.
  int num_ranks = 1;
  // Stages hosted by each rank; the pipeline has num_ranks * stages_per_rank stages.
  // GPipe and 1F1B require exactly 1 (stage index == rank); ZBVZeroBubble and DualPipeV exactly 2.
  int stages_per_rank = 1;
  // Microbatches per training step; >= 1.
  int num_microbatches = 1;
};

// Number of pipeline stages `config` describes: num_ranks * stages_per_rank.
int NumStages(const ScheduleConfig& config);

// The schedule in time-aligned form: element r is rank r's list, where std::nullopt is an idle
// slot that lines actions up in time across ranks (PyTorch's raw list, the golden
// `.compute_raw.csv` form). For kinds whose PyTorch pipeline_order already keeps idle slots this
// equals GenerateSchedule().
// INVALID_ARGUMENT if the config is invalid or violates the kind's constraint (same message shape
// as PyTorch, e.g. "Number of microbatches (2) must be greater than or equal to the number of
// stages (4).").
absl::StatusOr<PipelineOrder> GenerateTimeAligned(const ScheduleConfig& config);

// The schedule as PyTorch's `pipeline_order`: for GPipe and 1F1B the time-aligned list with idle
// slots dropped and "{stage}REDUCE_GRAD" appended after each stage's last backward (the golden
// `.compute.csv` form); for the other kinds the time-aligned list itself. Errors as
// GenerateTimeAligned.
absl::StatusOr<PipelineOrder> GenerateSchedule(const ScheduleConfig& config);

// How stages are placed on ranks.
enum class MappingStyle {
  // Stage s on rank s % num_ranks (PyTorch's "loop"; GPipe, 1F1B, interleaved schedules).
  kLoop,
  // Zig-zag: blocks of num_ranks stages alternate direction, so rank r holds stages r and
  // 2*num_ranks-1-r, ... (PyTorch's "v"; ZBVZeroBubble, DualPipeV).
  kV,
};

// The placement `kind` assumes: kV for kZBVZeroBubble, kDualPipeV, kVHalf and kVMin, else kLoop.
MappingStyle DefaultMappingStyle(ScheduleKind kind);

// "loop" or "v" (case-insensitive). INVALID_ARGUMENT naming the valid styles otherwise.
absl::StatusOr<MappingStyle> ParseMappingStyle(absl::string_view name);

// "loop" or "v".
absl::string_view MappingStyleName(MappingStyle style);

// Element s is the rank that runs stage s (PyTorch's generate_stage_to_rank_mapping).
// INVALID_ARGUMENT if num_stages < 1 or num_ranks < 1, or for kV if num_stages is not a multiple
// of num_ranks.
absl::StatusOr<std::vector<int>> StageToRank(int num_stages, int num_ranks, MappingStyle style);

// Element r lists the stages of rank r in increasing order (PyTorch's
// generate_rank_to_stage_mapping). Errors as StageToRank.
absl::StatusOr<std::vector<std::vector<int>>> RankToStages(int num_stages, int num_ranks,
                                                           MappingStyle style);

// Inverts any stage-to-rank map (e.g. the one ValidateComputeSchedule infers): element r lists
// the stages s with stage_to_rank[s] == r, in increasing order. INVALID_ARGUMENT if an entry is
// outside [0, num_ranks).
absl::StatusOr<std::vector<std::vector<int>>> InvertStageToRank(
    const std::vector<int>& stage_to_rank, int num_ranks);

}  // namespace stagecoach::schedule
