// A job as the coordinator tracks it: its spec and plan, its state machine, its ranks, the
// steps they reported and the events WatchJob streams.
//
// State machine (one enum, v1::JobState; one transition function, Job::TransitionTo):
//
//          (1)              (2)
//   PENDING ----> RUNNING ------> SUCCEEDED
//      |  \          |
//      |   \(3)      |(3)
//      |    `----> FAILED
//      |(4)          |(4)
//      `---------> CANCELLED <-'
//
//   (1) every rank accepted its task (StartTask succeeded on each placed worker)
//   (2) every rank reported its task SUCCEEDED (all steps done)
//   (3) a rank failed, a worker was lost, or a task could not be started; the reason is the
//       root cause (which worker and rank, which action, what error)
//   (4) a client cancelled it
// SUCCEEDED, FAILED and CANCELLED are final. While PENDING, `reason` says what the job waits for.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "coordinator/planner.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// True for SUCCEEDED, FAILED and CANCELLED.
bool IsFinal(v1::JobState state);

// OK when the diagram above has an edge from -> to; FAILED_PRECONDITION otherwise.
absl::Status CheckTransition(v1::JobState from, v1::JobState to);

// "PENDING", "RUNNING", ... (the enum name without its prefix).
std::string JobStateName(v1::JobState state);

// One rank of a placed job.
struct RankSlot {
  int rank = 0;
  std::string worker_id;
  std::string worker_address;
  std::vector<int> stages;
  std::vector<std::string> actions;           // assigned, lowered
  std::vector<std::string> executed_actions;  // in the latest reported step
  int64_t steps_done = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  std::map<int, int64_t> bytes_sent_to;        // by peer rank
  std::map<int, int64_t> bytes_received_from;  // by peer rank
  int64_t parameters = 0;                      // held by the rank's worker, as reported
  bool task_ended = false;                     // ReportTaskEnd received, or the task was stopped
  v1::TaskOutcome outcome = v1::TASK_OUTCOME_UNSPECIFIED;
  std::string error;
};

// Reports of one step, until every rank has sent its own.
struct StepAggregate {
  int ranks_reported = 0;
  std::vector<double> microbatch_losses;  // from the rank that owns the last stage
  absl::Duration slowest = absl::ZeroDuration();
  std::vector<double> bubble_ratios;  // indexed by rank
};

struct Job {
  std::string id;
  spec::JobSpec spec;
  std::string spec_yaml;
  Plan plan;
  absl::Time created;

  v1::JobState state = v1::JOB_STATE_PENDING;
  std::string reason;
  std::vector<v1::JobTransition> history;

  int attempt = 0;              // incremented each time the job is placed
  bool starting = false;        // StartTask calls of the current attempt are in flight
  std::vector<RankSlot> ranks;  // empty until placed
  std::map<int64_t, StepAggregate> partial_steps;
  int64_t steps_completed = 0;            // steps every rank has finished
  std::vector<double> losses;             // one per completed step, unless forward-only
  std::vector<double> max_bubble_ratios;  // one per completed step: the largest over ranks

  // Infer jobs (forward-only, one step on a client batch). The inputs are dropped when the job
  // ends; the outputs (from the last stage's rank) when Infer hands them to its caller.
  bool inference = false;
  v1::TensorData inference_inputs;
  std::optional<v1::TensorData> inference_outputs;

  // Checkpoints (training.checkpoint, training.resume_from; docs/checkpoints.md).
  // The checkpoint the job resumed from, and each of its stages' files (indexed by stage);
  // unset / empty without training.resume_from.
  std::optional<v1::JobCheckpoint> resumed_from;
  std::vector<std::vector<v1::StageCheckpointFile>> resume_files;
  // Steps of the job's timeline before its first step: resumed_from's step, else 0. Global
  // step numbers (ReportStepRequest.global_step, checkpoint steps) count from it.
  int64_t base_step = 0;
  // Stage files reported for checkpoints that are not complete yet: global step -> stage ->
  // that stage's files.
  std::map<int64_t, std::map<int, std::vector<v1::StageCheckpointFile>>> checkpoint_files;
  // Complete checkpoints (every stage's files and the manifest written), oldest first.
  std::vector<v1::JobCheckpoint> checkpoints;

  int64_t steps_done() const { return steps_completed; }
  bool forward_only() const { return !plan.has_backward; }

  std::vector<v1::JobEvent> events;

  // Moves to `to` if the state machine allows it, recording history and a state-change event.
  absl::Status TransitionTo(v1::JobState to, const std::string& why, absl::Time now);

  // Appends an event (sequence numbers from 0).
  void AddEvent(v1::JobEvent event, absl::Time now);

  // Key prefix of the current attempt in the rendezvous store.
  std::string RendezvousPrefix() const;

  void ToProto(v1::Job* out) const;
};

}  // namespace stagecoach::coordinator
