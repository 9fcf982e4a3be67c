// The stall rule: when a RUNNING job's step has run longer than its stall bound, the job is
// STALLED (a condition, not a state: v1::JobStall), and each rank is named with what it is in
// and what it waits on, from its latest progress beacon (worker/runtime/executor/
// progress_beacon.h), e.g.
//
//   rank 2: RECV_F stage 3 microbatch 5 from rank 1 (host-b:41234), waiting 41.2 s
//   rank 1: silent for 38.0 s (no heartbeat); last heard: in F stage 2 microbatch 5
//
// The bound is --stall-after when set, else 5x the median of the job's recent steps and at
// least 30 s (a job that has not completed a step yet has the 30 s). The step's running time
// is counted from the later of when the coordinator saw the previous step complete (or the job
// become RUNNING) and when the earliest rank began its current step's actions, that step or a
// later one (a rank may run ahead of the steps the coordinator saw complete; beacons carry how
// long ago: no clock agreement is needed); a step some rank is still setting up for
// (RANK_PHASE_SETUP) is not stalled, nor is one no rank has begun.
//
// Pure functions of their inputs and `now`; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "stagecoach/v1/diagnosis.pb.h"

namespace stagecoach::coordinator {

struct StallOptions {
  // --stall-after; unset: `median_factor` x the median step, at least `floor`.
  std::optional<absl::Duration> stall_after;
  double median_factor = 5.0;
  absl::Duration floor = absl::Seconds(30);
  // A rank whose latest beacon is older than this is "silent" (its heartbeats stopped: a frozen
  // or partitioned worker). The coordinator uses 2.5 heartbeat intervals.
  absl::Duration silent_after = absl::Seconds(5);
};

// One task (rank of a replica) of the job as the coordinator knows it.
struct RankView {
  int rank = 0;
  int replica = 0;
  std::string worker_id;
  std::string address;
  // Its latest beacon of the job's current attempt (null: none), and when it arrived. Not owned:
  // the job's diagnosis holds it, and a RankView lives only while the job table's lock is held,
  // so that the tick's pass over every running job copies no beacon.
  const v1::RankProgress* progress = nullptr;
  absl::Time received = absl::InfinitePast();
  // Its worker's latest heartbeat (with or without a beacon); InfinitePast when not known. A
  // rank is silent when neither arrived for StallOptions::silent_after.
  absl::Time last_heartbeat = absl::InfinitePast();
};

struct StallInputs {
  // The global step the job is in (the steps every rank has finished).
  int64_t step = 0;
  // When the coordinator saw the previous step complete, or the job become RUNNING.
  absl::Time step_began = absl::InfinitePast();
  // Every task of the job, in task order (replica by replica).
  std::vector<RankView> ranks;
};

// The median of `steps` (zero when empty).
absl::Duration MedianDuration(std::vector<absl::Duration> steps);

// The stall bound for a job whose recent completed steps took `recent_steps`.
absl::Duration StallBound(const StallOptions& options,
                          const std::vector<absl::Duration>& recent_steps);

// How long the job's current step has run at `now`; unset when it has not begun (no rank began
// its actions) or a rank is still setting up. A setting-up beacon counts only while its rank is
// heard from (within `options.silent_after`): a worker frozen before its first heartbeat of the
// step left a setting-up beacon behind, and must not hold the stall off for ever.
std::optional<absl::Duration> StepRunning(const StallInputs& in, const StallOptions& options,
                                          absl::Time now);

// The rank's state in one line (RankDiagnosis.summary), naming peers by rank and address; a
// rank whose worker fell silent says so first ("silent for 12.0 s (no heartbeat); last heard:
// ...").
std::string SummarizeRank(const RankView& rank, const std::vector<RankView>& all,
                          const StallOptions& options, absl::Time now);

// Every rank's RankDiagnosis at `now`.
std::vector<v1::RankDiagnosis> DiagnoseRanks(const std::vector<RankView>& ranks,
                                             const StallOptions& options, absl::Time now);

// The job's stall at `now` with bound `bound`, or nullopt when its step has not run that long.
std::optional<v1::JobStall> EvaluateStall(const StallInputs& in, absl::Duration bound,
                                          const StallOptions& options, absl::Time now);

// "F stage 2 microbatch 5" for "2F5"; the action itself when it does not parse that way.
std::string DescribeAction(const std::string& action);

}  // namespace stagecoach::coordinator
