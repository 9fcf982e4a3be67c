// Lowering passes over per-rank action lists, as torch.distributed.pipelining runs them between
// a compute-only schedule and the list a worker executes. Pure functions; thread-safe.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/action.h"

namespace stagecoach::schedule {

// PyTorch's _add_reduce_grad for one rank: drops idle slots and, right after the action that
// completes a stage's `num_microbatches`-th B or W (the sub-actions of OVERLAP_F_B count one by
// one), appends "{stage}REDUCE_GRAD". Everything else is kept in order.
RankActions AddReduceGrad(const RankActions& actions, int num_microbatches);

// PyTorch's _add_unshard_reshard for one rank: drops idle slots and, before each action, computes
// the window of the next `max_active_stages` distinct stages the remaining actions (from this one
// on) touch, in order of first appearance (OVERLAP_F_B contributes all its sub-actions' stages, so
// its window may hold one more); RESHARDs the active stages outside the window, in increasing
// stage order, then UNSHARDs the window's stages not yet active, in window order. At the end it
// RESHARDs every stage still active, in increasing order. PyTorch runs it with
// max_active_stages = 3 whether or not stages are sharded; it iterates a Python set for the
// RESHARD order, which is increasing order whenever the active stages differ modulo the set's
// table size (always below 8 stages per rank, and in every golden file). Linear in the number of
// actions times the stages per rank (PyTorch rescans the rest of the list for every action).
// max_active_stages >= 1.
RankActions AddUnshardReshard(const RankActions& actions, int max_active_stages);

// AddUnshardReshard's window for placement.unshard when stages keep their parameters sharded
// (placement.shard: parameters), for a schedule of `num_stages` stages:
//  - "step": all of them. Every stage of the rank is UNSHARDed before the rank's first action
//    of the step, so all its all-gathers start at once, and RESHARDed after its own last action;
//  - "stage": 2, the stage of the current action and the next other one the rank's list
//    touches: that one's all-gather starts while this one computes, and a stage is released as
//    soon as two others come before its next use (one all-gather per run of a stage's actions).
// Anything else: 0 (no UNSHARD/RESHARD).
int UnshardWindow(absl::string_view unshard, int num_stages);

// PyTorch's _merge_bw for one rank: drops idle slots and merges an I directly followed by the W
// of the same stage and microbatch into one B.
RankActions MergeBackward(const RankActions& actions);

// PyTorch's _add_send_recv: turns per-rank lists without communication into lists with SEND_F /
// RECV_F / SEND_B / RECV_B, one row per rank of `compute`.
//
// Works in rounds; each round visits the ranks in order and takes the head of each rank's list if
// it is ready. A forward of stage s > 0 is ready once this rank holds RECV_F(s, mb) or has run
// F(s-1, mb); an I or B of stage s < last once it holds RECV_B(s, mb) or has run I/B(s+1, mb);
// OVERLAP_F_B once all its sub-actions are; anything else (W, UNSHARD, RESHARD, REDUCE_GRAD) at
// once. A taken action is appended, and each F (each I or B) whose next (previous) stage is on
// another rank appends SEND_F (SEND_B) after it and RECV_F(s+1, mb) (RECV_B(s-1, mb)) to the
// receiving rank's list at the same moment. Stages on the same rank exchange nothing.
//
// Idle slots in `compute` are dropped without spending a round, so the result depends only on
// each rank's order of actions. (PyTorch's runtime never passes idle slots to this pass: the
// passes before it drop them. Passed directly, PyTorch's function would spend a round on each;
// the golden `.sendrecv_only.csv` lists match dropping them.)
//
// `stage_to_rank` has one entry per stage (num_stages of them), each a row of `compute`.
// INVALID_ARGUMENT if the inputs disagree (size, a stage out of range, an action on a rank other
// than its stage's), or if a round makes no progress; that error names each rank's stuck head
// action and the action it waits for.
absl::StatusOr<PipelineOrder> AddSendRecv(const PipelineOrder& compute,
                                          const std::vector<int>& stage_to_rank, int num_stages);

// How LowerSchedule lowers.
struct LoweringOptions {
  // Window of AddUnshardReshard; 0 leaves the pass out. 3 is PyTorch's runtime.
  int max_active_stages = 3;
};

// PyTorch's runtime lowering of a compute-only schedule (_prepare_schedule_with_comms): per rank
// AddUnshardReshard (unless disabled) and AddReduceGrad, then AddSendRecv across ranks. REDUCE_GRAD
// actions already in `compute` (GPipe's and 1F1B's pipeline_order carry them) are dropped first
// and re-inserted, so lowering either form of a schedule gives the same list. The compute
// schedule must be valid; errors as AddSendRecv.
absl::StatusOr<PipelineOrder> LowerSchedule(const PipelineOrder& compute,
                                            const std::vector<int>& stage_to_rank, int num_stages,
                                            int num_microbatches,
                                            const LoweringOptions& options = {});

}  // namespace stagecoach::schedule
