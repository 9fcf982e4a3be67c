// What the schedule simulator is told a plan's actions cost, from the model's profiled layer
// times (a worker's InspectModel): the planner's memory prediction and its plan search simulate
// plans with it. Pure functions; thread-safe.
#pragma once

#include "common/schedule/simulator.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {

// What the profile does not measure: the cost of a message between two workers.
struct CostAssumptions {
  // Fixed cost of every message, in seconds: posting the send and receive, the transport's
  // latency and waking the receiver.
  double message_latency_seconds = 0;
  // Bytes per second of the link between two workers; 0 means infinite.
  double link_bytes_per_second = 0;
  // Seconds of a rank's own time each message to or from another rank takes (posting it,
  // copying, waiting on the transport's threads), on both ends: added to the compute action
  // that sends or consumes it (F receives its input and sends its output, B and I the
  // gradients), where the latency above overlaps with compute.
  double message_cpu_seconds = 0;
};

// The assumptions the coordinator plans with unless its flags say otherwise: a message costs
// 100 us of latency at 2 GB/s and 500 us of each end's time, the figures that ordered real
// runs best on a 2-core host with CPU workers over Gloo (bench/plan_bench; docs/planning.md).
// A GPU cluster's NCCL messages cost far less of a rank's time: set the coordinator's
// --plan-message-cost and --plan-message-latency for it.
CostAssumptions DefaultCostAssumptions();

// Per stage of `plan`, in seconds: F and B the sums of its layers' profiled forward and
// backward times, I and W the sums of their profiled split backward (backward_input_seconds,
// backward_weight_seconds), or half of B each where a layer has none; each stage's messages
// carry its last layer's output_bytes; F, B and I each add message_cpu_seconds for every
// message between their stage and a stage on another rank. When no layer has a profiled time the
// per-stage costs are left empty (the simulator's defaults, F 1, B 2, I 1, W 1, in abstract units)
// and the assumptions are not applied. With replicas, each stage's collectives run on its rank's
// communication queue (CostModel::overlap_collectives), as ring messages of the link above: of a
// stage of N parameters and c = 4 ceil(N / replicas) bytes per shard, D - 1 messages of c for a
// reduce-scatter or an all-gather. REDUCE_GRAD takes an all-reduce (2(D - 1) messages) without
// sharding, the reduce-scatter alone with shard optimizer or gradients, whose all-gather of the
// stepped shards follows the optimizer step (CostModel::per_stage_after_step: it lengthens the
// rank's step, hidden by nothing), and the reduce-scatter alone with shard parameters, whose
// UNSHARD takes an all-gather.
schedule::CostModel PlanCostModel(const Plan& plan, const CostAssumptions& assumptions = {});

// Each rank's predicted compute per step and bubble ratio, from the schedule simulator: with
// PlanCostModel(plan, assumptions) when the layers carry profiled times (compute in seconds,
// *in_seconds true); otherwise with each stage's F its share of the model's parameters, B twice
// that, I and W once, and messages free (compute a share of the step's compute, *in_seconds
// false). Empty when the plan cannot be simulated (a schedule file's lists the simulator
// refuses).
std::vector<PredictedRankTime> PredictRankTimes(const Plan& plan,
                                                const CostAssumptions& assumptions,
                                                bool* in_seconds);

}  // namespace stagecoach::coordinator
