// What a job's plan holds in the coordinator's memory, and the bound on all live plans
// (--max-plan-memory).
//
// A plan's bulk is its action lists: the lowered schedule (one schedule::Action per action of
// every rank) and, once the job is placed, each rank's assigned actions as text. A job of 512
// stages and 976 microbatches holds about 3.5 million actions, some 170 MB. When a job ends its
// lists are kept (its schedule and executed actions stay visible) only when they hold at most
// kKeptPlanBytes, and even then only while room is not needed: admission counts every plan
// still held, live or ended, against --max-plan-memory, releases ended jobs' lists (oldest
// ended first) to make room, and refuses a job only when the live jobs' plans leave none.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {

struct Job;

// The most an ended job's action lists may hold and still be kept (4 MiB: about 50,000 actions).
inline constexpr int64_t kKeptPlanBytes = int64_t{4} << 20;

// Bytes a plan's action lists hold, estimated from its action count: each action as a
// schedule::Action in the lowered lists and as a string in its rank's assigned actions (short
// action names fit std::string's own buffer), a third more for the vectors' slack and the
// allocator's headers (about 107 bytes an action). 0 once released.
int64_t PlanMemoryBytes(const Plan& plan);

// Makes room for a new plan of `plan_bytes` among `jobs` within `limit` bytes (<= 0: no bound):
// OK when it fits beside the plans they hold, after releasing the action lists of ended jobs
// (Job::ReleaseActionLists, the earliest ended first) as far as needed; RESOURCE_EXHAUSTED
// when the live jobs' plans alone leave no room, naming both sizes, the number of live jobs, the
// limit and --max-plan-memory (nothing is released then).
absl::Status MakeRoomForPlan(int64_t plan_bytes, const std::vector<Job*>& jobs, int64_t limit);

}  // namespace stagecoach::coordinator
