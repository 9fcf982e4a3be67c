// What the schedule simulator is told a plan's actions cost, from the model's profiled layer
// times (a worker's InspectModel): the planner's memory prediction and its plan search simulate
// plans with it. Pure functions; thread-safe.
#pragma once

#include "common/schedule/simulator.h"
#include "coordinator/planner.h"

namespace stagecoach::coordinator {

// What the profile does not measure: the cost of a message between two workers.
struct CostAssumptions {
  // Fixed cost of every message, in seconds: posting the send and receive, the transport's
  // latency and waking the receiver.
  double message_latency_seconds = 0;
  // Bytes per second of the link between two workers; 0 means infinite.
  double link_bytes_per_second = 0;
};

// The assumptions the coordinator plans with (a CPU worker's Gloo pair on one host, measured
// by bench/plan_bench): 150 microseconds a message and 2 GB/s.
CostAssumptions DefaultCostAssumptions();

// Per stage of `plan`, in seconds: F and B the sums of its layers' profiled forward and
// backward times, I and W the sums of their profiled split backward (backward_input_seconds,
// backward_weight_seconds), or half of B each where a layer has none; each stage's messages
// carry its last layer's output_bytes. When no layer has a profiled time the per-stage costs
// are left empty (the simulator's defaults, F 1, B 2, I 1, W 1, in abstract units) and the
// assumptions are not applied.
schedule::CostModel PlanCostModel(const Plan& plan, const CostAssumptions& assumptions = {});

}  // namespace stagecoach::coordinator
