// `stagectl watch` (and `submit --wait`): what a job's event stream has shown so far, and how
// it is drawn. Pure functions, so that the live view is unit-tested without a terminal: the
// caller feeds events into a WatchState and prints ProgressLine (a TTY, redrawn in place),
// StepLine and StateLine (one plain line per event), or EventJson (JSON lines / YAML documents).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

// A job as its events describe it.
struct WatchState {
  // How many recent step times the ETA averages.
  static constexpr int kRecentSteps = 10;

  std::string job_id;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  // Whether a StepCompleted has been seen; the step fields below are meaningful only then.
  bool has_step = false;
  // Steps done in this run (StepCompleted.step + 1) and the run's total.
  int64_t steps_done = 0;
  int64_t steps_total = 0;
  // The latest step's number in the job's timeline (StepCompleted.global_step).
  int64_t global_step = 0;
  // The latest step's mean loss; unset for forward-only steps.
  std::optional<double> loss;
  double samples_per_second = 0;
  // Token data: tokens counted in the loss per second, and the share of positions that were
  // padding; 0 for other data.
  double tokens_per_second = 0;
  double padding_waste = 0;
  // The latest step's wall time (slowest rank), the largest measured bubble ratio over the
  // ranks in that step (0..1), every rank's (by task: replica * num_ranks + rank) and the ranks
  // per replica (0 from a coordinator that does not say).
  absl::Duration step_time = absl::ZeroDuration();
  double max_bubble_ratio = 0;
  std::vector<double> bubble_ratios;
  int num_ranks = 0;
  // Whether the latest step ran on a client's batch (StepJob).
  bool client_batch = false;
  // The latest kRecentSteps step times, oldest first.
  std::deque<absl::Duration> recent_step_times;
  // The training recipe: the latest step's learning rate (0 when not reported) and gradient
  // norm, whether it was skipped (and on which ranks the gradients were not finite), steps
  // skipped so far in this stream, and the latest validation loss seen.
  double learning_rate = 0;
  std::optional<double> grad_norm;
  bool skipped = false;
  std::vector<int> nonfinite_ranks;
  int64_t skipped_seen = 0;
  std::optional<double> eval_loss;
};

// Folds one event into `state` (a state change sets `state`; a completed step the step fields).
void ApplyEvent(const v1::JobEvent& event, WatchState* state);

// The mean of the recent step times times the steps left; nullopt when unknown (no step yet, or
// the job is not RUNNING: paused, restarting, ended).
std::optional<absl::Duration> EstimateRemaining(const WatchState& state);

// A duration for people, rounded to the second: "42s", "3m07s", "2h05m"; "?" for negative or
// absurd (> 1000 h) durations.
std::string FormatEta(absl::Duration remaining);

// The plain step line, as printed once per step when stdout is not a terminal:
// "step 12/40  loss 0.123456  830 samples/s  0.042s/step  bubble 0.120 mean, 0.310 worst (rank
// 1)  ETA 1m12s": the bubble is the step's mean over the ranks and its worst rank
// (BubbleSummary). The loss is
// "-" for forward-only steps and the ETA "-" when EstimateRemaining is unknown; a step on a
// client's batch ends in "  (client batch)", and one whose global step is ahead of its run's
// step number (a resumed or client-stepped timeline) says so ("  global 52"). Then the training
// recipe's parts when reported: "  lr 0.0003", "  gnorm 1.25", "  SKIPPED (non-finite on rank
// 1)" and the latest validation loss "  eval 0.4321". Empty before the first step.
std::string StepLine(const WatchState& state);

// The live line for a terminal `width` columns wide: a progress bar (when there is room) and the
// StepLine text (a compact form of it, "12/40 loss 0.1235 830/s 0.042s/step bubble 0.12/0.31@r1
// ...", when the full one leaves
// no room for a bar; the state appended when the job is not RUNNING), cut so that it never wraps
// (at most width - 1 characters). Before the first step: the job id and its state.
std::string ProgressLine(const WatchState& state, int width);

// A state change as its own line: "12:03:04 PAUSED  paused after step 40" (time of day in
// `zone`; no reason part when the transition has none).
std::string StateLine(const v1::JobTransition& transition, absl::TimeZone zone);

// The line `watch` prints when the coordinator no longer kept events the watcher asked for.
std::string DroppedLine(const v1::EventsDropped& dropped);

// A ReplicaLost event: "12:00:03 DEGRADED  replicas 1/2 healthy: replica 1 left (worker w-3
// (rank 1 of replica 1) lost: ...); step 23 runs again on the healthy ones".
std::string ReplicaLostLine(const v1::JobEvent& event, absl::TimeZone zone);

// "12:00:03 SNAPSHOT  in memory after global step 20 (1.2 MiB, 2 ranks, each on 2 workers)".
std::string SnapshotTakenLine(const v1::JobEvent& event, absl::TimeZone zone);

// The line of an event that is not a completed step: StateLine, ReplicaLostLine,
// ReplicaHealedLine, SnapshotTakenLine or DroppedLine.
std::string NoticeLine(const v1::JobEvent& event, absl::TimeZone zone);

// A ReplicaHealed event: "12:00:09 HEALED  replica 1 rejoined at global step 31 with replica
// 0's state (2/2 healthy; degraded for 5.8 s)".
std::string ReplicaHealedLine(const v1::JobEvent& event, absl::TimeZone zone);

// One event for programs: {"job_id", "sequence", "time", "event": "state_change" |
// "step_completed",
// ...} with, for a state change, "state" and "reason"; for a step, "step", "global_step",
// "steps_total", "loss" (null for forward-only steps), "step_time_seconds", "samples_per_second",
// "tokens_per_second" and "padding_waste" (0 but for token data), "bubble_ratios",
// "max_bubble_ratio", "client_batch", and the training recipe's "learning_rate", "grad_norm" (null
// without training.grad_clip), "skipped", "nonfinite_ranks" and, after a validation pass,
// "eval_loss". Times are RFC 3339 UTC.
nlohmann::json EventJson(const v1::JobEvent& event);

}  // namespace stagecoach::client
