// A cost-model simulator for lowered schedules (the lists AddSendRecv / LowerSchedule produce):
// how long a training step takes when every action has a given cost and every message a given
// latency and bandwidth, and where each rank waits. Time is in abstract units (the cost model's);
// FormatChromeTrace (chrome_trace.h) turns the result into a trace. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/action.h"

namespace stagecoach::schedule {

// Durations of one stage's compute actions, in time units.
struct StageCosts {
  double forward = 1;          // F
  double backward = 2;         // B: the full backward, I and W together
  double backward_input = 1;   // I
  double backward_weight = 1;  // W
};

// What every action and message costs. All values must be finite and >= 0.
struct CostModel {
  // Costs of every stage without an entry in per_stage.
  StageCosts defaults;
  // Element s overrides `defaults` for stage s; may be shorter than the number of stages, not
  // longer.
  std::vector<StageCosts> per_stage;
  // Durations of UNSHARD, RESHARD and REDUCE_GRAD, in time units.
  double unshard = 0;
  double reshard = 0;
  double reduce_grad = 0;
  // Element s overrides `unshard` (`reduce_grad`) for stage s: its all-gather (its gradients'
  // reduction); may be shorter than the number of stages, not longer.
  std::vector<double> per_stage_unshard;
  std::vector<double> per_stage_reduce_grad;
  // UNSHARD and REDUCE_GRAD hand their collective to the rank's communication queue and take
  // no time of the rank's own (Stagecoach's workers): each collective starts once the rank
  // reaches its action and the queue is free, and lasts the action's cost; F, I, B and W of a
  // stage start no earlier than the end of the all-gather of the stage's latest UNSHARD, and so
  // does its RESHARD (which then takes its cost); a rank ends no earlier than its queue. Off:
  // both take their cost on the rank, one action after another.
  bool overlap_collectives = false;
  // Element s: work for stage s after its rank's last action and its communication queue (ZeRO
  // levels optimizer and gradients: the all-gather of the stepped shards follows the optimizer
  // step, so nothing in the step hides it). A rank ends that much later for each of its stages;
  // it is not busy time. May be shorter than the number of stages, not longer.
  std::vector<double> per_stage_after_step;
  // Fixed cost of every message, in time units.
  double latency = 0;
  // Bytes per time unit of every link; 0 means infinite (a message takes only `latency`).
  double bandwidth = 0;
  // Size in bytes of every activation (SEND_F) and gradient (SEND_B) message.
  double message_bytes = 0;
  // Element s overrides message_bytes for the messages stage s sends (both directions); may be
  // shorter than the number of stages, not longer.
  std::vector<double> per_stage_message_bytes;
};

// One executed action of one rank.
struct TimedAction {
  Action action;
  // When it started and ended, in time units. SEND and RECV actions have start == end == the time
  // they were posted; their transfers are Messages.
  double start = 0;
  double end = 0;
};

// One transfer: SEND_F(s, mb) to RECV_F(s+1, mb), or SEND_B(s, mb) to RECV_B(s-1, mb).
struct Message {
  Action send;
  Action recv;
  int from_rank = 0;
  int to_rank = 0;
  double posted_send = 0;  // when the sender posted its SEND
  double posted_recv = 0;  // when the receiver posted its RECV
  double start = 0;        // max(posted_send, posted_recv)
  double arrive = 0;       // start + latency + bytes / bandwidth
  double bytes = 0;
};

struct Simulation {
  // The latest end of any action (0 for a schedule without actions).
  double makespan = 0;
  // Element r: rank r's actions in execution order (idle slots left out).
  std::vector<std::vector<TimedAction>> timeline;
  // Every transfer, ordered by start time (ties by sending rank, then by the order the sender
  // posted them).
  std::vector<Message> messages;
  // Element r: the time rank r spends running actions (the sum of their costs; waiting for an
  // input, including inside an OVERLAP_F_B, is not busy time; collectives on the
  // communication queue are not either).
  std::vector<double> busy;
  // Element r: 1 - busy[r] / makespan (0 when makespan is 0).
  std::vector<double> bubble_ratio;
  // Element s: the most microbatches of stage s whose activations were held at once (see
  // Simulate).
  std::vector<int> peak_activations;
};

// Runs `lowered` (one list per rank; element s of `stage_to_rank` is the rank of stage s) under
// `costs`. Semantics:
//  - Each rank runs its list in order, one action at a time, on its own clock starting at 0; idle
//    slots (std::nullopt) are skipped and cost nothing.
//  - F, B, I and W take their stage's cost; UNSHARD, RESHARD and REDUCE_GRAD take the model's
//    (see CostModel::overlap_collectives for UNSHARD and REDUCE_GRAD handed to a queue).
//    OVERLAP_F_B runs its sub-actions one after another, each as it would run alone (waiting for
//    its own input); it spans from the first one's start to the last one's end, which is the sum
//    of their costs unless a later sub-action waits.
//  - SEND_x and RECV_x take no time: they post a send or a receive at the rank's current time.
//    A transfer starts once both its SEND and its RECV are posted and arrives latency +
//    bytes / bandwidth later. Transfers do not contend: concurrent ones do not slow each other.
//  - A compute action that consumes a tensor from another rank (F of stage s > 0 whose stage
//    s-1 is remote; I or B of stage s < last whose stage s+1 is remote) starts no earlier than
//    its message arrives (a blocking receive). One whose producer is on the same rank needs the
//    producer (F of s-1; I or B of s+1) to have run earlier on this rank.
//  - Activations of (stage, mb) are held from the end of its F until the end of its B or, with a
//    split backward, the end of its W. A forward-only schedule therefore never releases them.
// Errors, all INVALID_ARGUMENT:
//  - inconsistent inputs: num_stages or num_microbatches < 1, stage_to_rank not one rank in
//    [0, lowered.size()) per stage, a cost that is negative or not finite (the message names the
//    field, e.g. "costs.per_stage[2].forward"), per_stage, per_stage_message_bytes,
//    per_stage_unshard, per_stage_reduce_grad or per_stage_after_step longer than num_stages;
//  - an action the simulator cannot run: a stage or microbatch out of range, an action on a rank
//    other than its stage's, an OVERLAP_F_B holding anything but F, I, B and W, an action that
//    runs twice for the same (stage, mb), B or I before its F, W before its I, a SEND before the
//    compute that produces its tensor, a SEND or RECV between stages on the same rank or beyond
//    the first or last stage, a consumer of a remote tensor without an earlier RECV on its rank,
//    and a SEND or RECV left unmatched when every rank has finished;
//  - "deadlock: ...": no rank can progress; the message names each rank's blocked action and
//    what it waits for, as ValidateLoweredSchedule does.
// Only what running the lists needs is checked; ValidateLoweredSchedule checks the full rules
// (e.g. that every microbatch runs). Runs in time linear in the number of actions plus
// num_stages * num_microbatches, and O(n log n) to sort the messages.
absl::StatusOr<Simulation> Simulate(const PipelineOrder& lowered,
                                    const std::vector<int>& stage_to_rank, int num_stages,
                                    int num_microbatches, const CostModel& costs = {});

// A short human-readable summary for a terminal: the makespan, a table of busy time and bubble
// ratio per rank, and the peak activations per stage. Ends with "\n".
std::string FormatTimeline(const Simulation& simulation);

}  // namespace stagecoach::schedule
