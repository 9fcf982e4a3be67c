// Elastic shrink's planning (restart.elastic, docs/recovery.md): a job planned again on fewer
// workers than its own plan needs, keeping what makes its losses the same (the global batch and
// its microbatch boundaries, the schedule, the split policy, the recipe).
//
// From the job's own plan of R pipeline ranks x D replicas, v stages per rank and M microbatches
// per replica, a re-plan on W workers (min_workers <= W < R x D) tries the layouts of R' ranks x
// D' replicas with R' <= R, D' <= D and D' dividing D x M, most workers first (at most W, at
// least min_workers), and among those the deepest pipeline first (a lost worker of a replicated
// job costs a replica before it costs a re-split). Each is the job's spec with
// placement.workers R', placement.replicas D', schedule.microbatches D x M / D' (the same
// microbatches of the same global batch), split.stages v x R' (split.points dropped: the
// layers are cut again by split.policy) and, for a searched plan (schedule.kind auto), the
// schedule it chose. The first that PlanJob accepts and whose predicted per-rank memory fits
// placement.memory_limit (when set and the layers carry measured sizes) is the plan.
//
// Pure: no disk beyond what reading the spec needs (a model.hf's config), no lock.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {

struct ElasticPlan {
  std::string spec_yaml;  // the job's spec with the overrides above
  spec::JobSpec spec;
  Plan plan;
  // "1F1B on 3 ranks x 1 replica, 3 stages, 4 microbatches", for reasons and logs.
  std::string summary;
};

// The layout (R', D') tried for `workers`, in order (see the file comment); empty when none
// is possible. Pure arithmetic.
struct ElasticLayout {
  int ranks = 0;
  int replicas = 0;
  int microbatches = 0;  // per replica
  int stages = 0;
};
std::vector<ElasticLayout> ElasticLayouts(const Plan& own, int workers, int min_workers);

// The job (its own spec as YAML and its own plan, over the model's layers in own.layers)
// planned on `workers` workers. FAILED_PRECONDITION naming the job, the worker counts and the
// last refusal when no layout between min_workers and `workers` can be planned or fits;
// INVALID_ARGUMENT when the spec no longer reads.
absl::StatusOr<ElasticPlan> PlanOnWorkers(const std::string& job_id, const std::string& own_yaml,
                                          const Plan& own, int workers, int min_workers);

// "1F1B on 3 ranks x 1 replica, 3 stages, 4 microbatches".
std::string DescribeLayout(const Plan& plan);

}  // namespace stagecoach::coordinator
