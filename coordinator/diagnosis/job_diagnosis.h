// What the coordinator keeps per job to diagnose it while it runs: each task's latest progress
// beacon (HeartbeatRequest.progress), the durations of its recent steps (for the stall bound),
// its STALLED condition (stall_rule.h) and its stragglers (straggler_rule.h).
//
// The job manager feeds it: beacons from heartbeats, compute samples from step reports, step
// completions from step aggregation, and its tick, which says whether the job is RUNNING and
// turns the stall rule's verdict into the condition and its events.
//
// Not thread-safe: lives in its Job, under the job table's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/diagnosis/stall_rule.h"
#include "coordinator/diagnosis/straggler_rule.h"
#include "stagecoach/v1/diagnosis.pb.h"

namespace stagecoach::coordinator {

class JobDiagnosis {
 public:
  // Steps whose durations the stall bound's median is taken over.
  static constexpr int kRecentSteps = 20;

  // A new attempt of the job with `num_tasks` tasks: forgets the previous attempt's beacons,
  // stall and samples; `work_keys` (by task) name the stragglers' peers.
  void StartAttempt(int attempt, std::vector<std::string> work_keys, int num_ranks,
                    const StragglerOptions& stragglers);
  // The attempt StartAttempt last began; -1 before it.
  int attempt() const { return attempt_; }

  // A beacon of task `task`, arrived at `now`; ignored when of another attempt.
  void Record(int task, const v1::RankProgress& progress, absl::Time now);
  // The beacon of `task`, when one of the current attempt arrived, and when.
  const std::optional<v1::RankProgress>& progress(int task) const;
  absl::Time received(int task) const;

  // Whether the job runs (RUNNING) at `now`: the step clock starts when it begins running and
  // stops when it stops (a paused job's step has not stalled).
  void SetRunning(bool running, absl::Time now);
  // Every rank finished a step at `now`: its duration counts toward the median (when the job
  // ran all of it), and the next step's clock starts.
  void StepCompleted(absl::Time now);
  // When the current step's clock started; InfinitePast while not running.
  absl::Time step_began() const { return step_began_; }
  const std::deque<absl::Duration>& recent_steps() const { return recent_; }

  // The stall condition as the tick last set it (EvaluateStall's), and setting it. Returns
  // the event to log when the condition began (`stalled`) or ended (`stall_ended`).
  const std::optional<v1::JobStall>& stall() const { return stall_; }
  std::optional<v1::JobEvent> SetStall(std::optional<v1::JobStall> stall, absl::Time now);

  StragglerWatch& stragglers() { return stragglers_; }
  const StragglerWatch& stragglers() const { return stragglers_; }

 private:
  int attempt_ = -1;
  std::vector<std::optional<v1::RankProgress>> progress_;  // by task
  std::vector<absl::Time> received_;                       // by task
  bool running_ = false;
  absl::Time step_began_ = absl::InfinitePast();
  std::deque<absl::Duration> recent_;
  std::optional<v1::JobStall> stall_;
  StragglerWatch stragglers_;
};

}  // namespace stagecoach::coordinator
