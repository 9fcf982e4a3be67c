// The plan search behind `schedule.kind: auto` and `stagectl plan`: from the model's layers
// profiled on a worker (times and sizes at one or two microbatch sizes), every schedule x stages
// per worker x microbatch count x split policy the spec leaves open is planned (PlanJob),
// simulated with the profiled costs (plan_costs.h) and its memory predicted
// (memory_prediction.h), and the candidates are ranked: those within the memory limit first,
// each group by predicted step time. The coordinator takes the first; `stagectl plan` prints
// them all. Pure functions; thread-safe.
//
// What the spec pins, the search keeps: a named schedule.kind (only its variants are tried),
// schedule.microbatches, split.stages (stages per worker = stages / placement.workers),
// split.points (the one partition) and split.policy. placement.workers is required: the search
// chooses how the workers are used, not how many.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "common/spec/spec_overrides.h"
#include "coordinator/planning/plan_costs.h"
#include "coordinator/planning/planner.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// The model's layers as one InspectModel profile measured them, on microbatches of `rows` rows.
struct LayerProfile {
  int64_t rows = 0;
  std::vector<v1::LayerInfo> layers;
};

// The layers for microbatches of `rows` rows: every profiled time and size follows a line
// a + b x rows through two profiles (the two whose rows are nearest around `rows`, or the
// nearest two), or is proportional to rows with one profile; where the line would go below
// zero or falls with rows (noise), the nearest profile scaled by rows is used. Names and
// parameter counts are the first profile's. `profiles` must not be empty and all must hold
// the same layers.
std::vector<v1::LayerInfo> LayersForRows(const std::vector<LayerProfile>& profiles, int64_t rows);

// The microbatch counts the search tries for `spec`: schedule.microbatches when given, else
// the divisors of the rows each replica runs (training.batch_size / placement.replicas) from
// placement.workers to 8 x placement.workers and at most 64; when none is in that range, the
// largest divisor below it.
std::vector<int> SearchMicrobatchCounts(const spec::JobSpec& spec);

// The split policies the search tries: split.policy when given (or "points" with split.points),
// else equal-layers, equal-params, profiled, memory and fewer-first-last.
std::vector<std::string> SearchSplitPolicies(const spec::JobSpec& spec);

struct SearchOptions {
  // Bytes one worker may hold; 0 takes placement.memory_limit (0 there too: no limit).
  int64_t memory_limit_bytes = 0;
  // Limits, deadline and cancellation of planning each candidate (and of the whole search).
  PlanOptions planning;
  CostAssumptions costs = DefaultCostAssumptions();
};

struct SearchResult {
  // Ranked (see the file comment); ties by the smaller largest peak. Candidates whose stages
  // came out the same under two policies are listed once, under the first policy tried.
  std::vector<v1::PlanCandidate> candidates;
  int fitting = 0;                 // how many lead the list within the limit
  int64_t memory_limit_bytes = 0;  // the limit applied (0: none)
};

// Runs the search. Candidates a schedule's constraints rule out (1F1B with fewer microbatches
// than stages, more stages than layers, ...) are skipped. INVALID_ARGUMENT naming the field:
// placement.workers missing, a schedule.csv (one plan already), a schedule.kind that is
// neither auto nor a schedule with a backward, a memory limit with layers that carry no measured
// sizes (profiles on CUDA), or no candidate at all (with the reason the last one was refused).
// DEADLINE_EXCEEDED / CANCELLED as options.planning says.
absl::StatusOr<SearchResult> SearchPlans(const spec::JobSpec& spec,
                                         const std::vector<LayerProfile>& profiles,
                                         const SearchOptions& options);

// The spec fields a candidate sets: schedule.kind, schedule.microbatches, split.stages and
// split.policy (not with split.points, which stay).
spec::SpecOverrides CandidateOverrides(const v1::PlanCandidate& candidate);

// The plan to run: the first candidate and the next within the limit, with the counts.
// INVALID_ARGUMENT naming placement.memory_limit when none fits, with the smallest predicted
// peak any candidate had and which.
absl::StatusOr<v1::PlanChoice> ChoosePlan(const SearchResult& result);

// "ZBVZeroBubble, 2 stages/worker, 8 microbatches, split memory" for messages.
std::string DescribeCandidate(const v1::PlanCandidate& candidate);

}  // namespace stagecoach::coordinator
