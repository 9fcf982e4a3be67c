// The split policies (split.policy, docs/spec.md): what each one balances, over the ranks of
// the plan's schedule (rank_partition.h), not its stages.
//
//   equal-layers       one per layer; each layer's parameters instead when the layers' sizes are
//                      orders of magnitude apart (the largest 100x the smallest non-empty one: a
//                      norm or a small head against blocks), so that a stage holding a norm
//                      does not count as much as one holding a block
//   equal-params       each layer's parameters
//   profiled           each layer's measured forward + backward time
//   memory             each rank's predicted memory under the schedule (memory_partition.h)
//   fewer-first-last   one per layer, the first and the last layer counting two
//
// Pure functions; thread-safe.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {

// Each stage's first layer under spec.split.policy for `plan`, whose schedule is built
// (stage_to_rank, num_stages) and whose `layers` are set. INVALID_ARGUMENT naming
// split.policy when the policy needs what the layers do not carry (profiled times, measured
// sizes); DEADLINE_EXCEEDED / CANCELLED as `options` say.
absl::StatusOr<std::vector<int>> SplitByPolicy(const spec::JobSpec& spec, const Plan& plan,
                                               const PlanOptions& options);

// The default split (split.policy not given, no split.points) of a built-in model is
// `profiled` when profiling it is cheap and a live worker can do it at admission, else
// `equal-params`; a TorchScript model's is `equal-layers`. Profiling is cheap when
// ProfileFlops is at most this: a second or two of one CPU core.
inline constexpr double kCheapProfileFlops = 5e10;

// What a worker's profile of `spec`'s built-in model costs, in floating-point operations: each
// layer's forward on one microbatch (2 x parameters x rows, and for a GPT's blocks the
// attention's 4 x seq x d_model per token) run about 30 times (a warm-up and 3 timed repeats of
// forward, backward and split backward, and one measured pass). 0 for a TorchScript model.
double ProfileFlops(const spec::JobSpec& spec);

}  // namespace stagecoach::coordinator
