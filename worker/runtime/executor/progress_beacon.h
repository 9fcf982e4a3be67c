// What one rank is doing now, for the coordinator's stall rule and `stagectl diagnose`
// (coordinator/diagnosis/): the executor marks each action it runs and each wait on another
// rank, the task marks the phases around its steps, and the worker's heartbeat thread reads the
// beacon and sends it with each heartbeat (HeartbeatRequest.progress).
//
// Cheap enough to mark every action: a mark takes a lock no other thread holds for longer than
// a Read, which copies the small current state and the last kRecentActions finished actions.
// Durations are read from `now` (absl::Now by default), so a beacon carries how long, not since
// when: the coordinator needs no clock agreement with the worker.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagecoach/v1/diagnosis.pb.h"

namespace stagecoach::runtime {

class ProgressBeacon {
 public:
  // Finished actions a Read returns, the latest.
  static constexpr int kRecentActions = 32;

  // The task's identity, copied into every Read. Starts in RANK_PHASE_SETUP.
  ProgressBeacon(
      std::string job_id, int attempt, int rank, int replica,
      std::function<absl::Time()> now = [] { return absl::Now(); });

  // The step `global_step` begins: RANK_PHASE_ACTIONS, its step clock from now.
  void BeginStep(int64_t global_step);
  // A phase within the step (SENDS, REDUCTION, OPTIMIZER, EVAL, CHECKPOINT), or after it
  // (BETWEEN_STEPS: the step clock stops; `next_step` is the step it runs next, or -1 to keep
  // the current number).
  void SetPhase(v1::RankPhase phase, int64_t next_step = -1);

  // An action (PyTorch syntax, "2F5") starts, and ends having waited `wait` for data.
  void BeginAction(const std::string& action);
  void EndAction(absl::Duration wait);

  // A blocking wait on rank `peer` (`kind` as RankWait.kind) starts, and ends.
  void BeginWait(const char* kind, int stage, int microbatch, int peer, uint64_t tag);
  void EndWait();

  // The beacon now.
  v1::RankProgress Read() const;

 private:
  struct Finished {
    int64_t step = 0;
    std::string action;
    absl::Time end;
    absl::Duration duration;
    absl::Duration wait;
  };

  const std::function<absl::Time()> now_;
  mutable absl::Mutex mu_;
  v1::RankProgress identity_ ABSL_GUARDED_BY(mu_);
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  v1::RankPhase phase_ ABSL_GUARDED_BY(mu_) = v1::RANK_PHASE_SETUP;
  absl::Time phase_start_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> step_start_ ABSL_GUARDED_BY(mu_);
  std::string action_ ABSL_GUARDED_BY(mu_);  // empty between actions
  absl::Time action_start_ ABSL_GUARDED_BY(mu_);
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  v1::RankWait wait_ ABSL_GUARDED_BY(mu_);
  absl::Time wait_start_ ABSL_GUARDED_BY(mu_);
  // A ring of the latest finished actions; next_ is where the next one goes.
  std::vector<Finished> recent_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stagecoach::runtime
