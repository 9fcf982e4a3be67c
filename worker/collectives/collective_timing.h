// When a step's collective calls ran, and how much of them the compute hid: what the gradient
// reduction (training/gradient_reduction.h) and the gathering of sharded parameters
// (sharding/parameter_gathering.h) both report. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace stagecoach::collectives {

// One collective call for a stage (a bucket's reduction, a stage's all-gather), relative to the
// start of its step.
struct CollectiveTiming {
  int stage = 0;
  int64_t bytes = 0;
  absl::Duration start;
  absl::Duration end;
};

struct CollectiveOverlap {
  // From the earliest start to the latest end; zero without calls.
  absl::Duration span;
  // 1 - min(waited, span) / span, clamped to [0, 1]; 0 without calls or with a zero span.
  double hidden_ratio = 0.0;
};

// `timings` and the time the compute thread `waited` for them.
CollectiveOverlap OverlapOf(const std::vector<CollectiveTiming>& timings, absl::Duration waited);

}  // namespace stagecoach::collectives
