// A job as the coordinator tracks it: its spec and plan, its state machine, its ranks, the
// steps they reported and the events WatchJob streams.
//
// State machine (one enum, v1::JobState; one transition function, Job::TransitionTo: no other
// code writes Job::state):
//
//   (new) --(0)--> PLANNING --(1)--> PENDING --(2)--> STARTING --(3)--> RUNNING --(5)--> SUCCEEDED
//                                        |   ^  \         |  ^
//                                        |   |   `(3)-.   (4)  (4)
//                                        |   |         v   v  |
//                                        |   |         PAUSED
//                                        |  (7)          |
//                                        |   |    (6)    |
//                                        `---+-------> RESTARTING <-- RUNNING (6)
//                                            `-----------'
//   Any state that is not final --(8)--> FAILED, --(9)--> CANCELLED.
//
//   (0) a client submitted it (admission: the spec parsed, the model inspected and split; a
//       spec that fails there is refused and never becomes a job), or the job table on disk
//       replays a recorded job's history after a coordinator restart
//   (1) the model was inspected and split; the job is queued for workers (gang semantics:
//       all of its ranks start together or it waits; strict FIFO)
//   (2) free workers were found and assigned; StartTask is being sent to each
//   (3) every rank accepted its task: RUNNING, or PAUSED when the job starts held
//       (SubmitJob start_paused, or a restart whose hold step is where it resumes)
//   (4) PauseJob: every rank holds at one step boundary (PAUSED); ResumeJob, RunSteps or a
//       client batch step (StepJob) set it running again (RUNNING)
//   (5) every rank reported its task SUCCEEDED (all steps done, told to finish)
//   (6) a rank failed or its worker was lost (missed heartbeats, killed, unreachable, a
//       transport error) and restart.max_restarts allows another attempt; or the coordinator
//       restarted while the job ran (not counted as a restart). Its tasks are stopped.
//   (7) free workers were found again: the next attempt starts from the latest checkpoint
//   (8) a failure with no restart left, or a task that could not be started; the reason and
//       Job.failure name the root cause (rank, worker, action, error)
//   (9) a client cancelled it
// SUCCEEDED, FAILED and CANCELLED are final. Every transition is kept in `history` with its
// reason and time, and streamed by WatchJob as a state-change event. While PENDING or
// RESTARTING, `reason` says what the job waits for.
//
// Timeline: steps are numbered globally across attempts and resumes ("global steps"): a job
// resumed from a checkpoint after 10 steps starts at global step 10 (base_step), and an
// attempt restarted from the checkpoint after step 25 starts at 25 (attempt_base).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "coordinator/diagnosis/job_diagnosis.h"
#include "coordinator/jobs/event_log.h"
#include "coordinator/jobs/rank_balance.h"
#include "coordinator/jobs/replica_health.h"
#include "coordinator/jobs/step_trace.h"
#include "coordinator/jobs/training_record.h"
#include "coordinator/planning/planner.h"
#include "coordinator/snapshots/snapshot_copies.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// True for SUCCEEDED, FAILED and CANCELLED.
bool IsFinal(v1::JobState state);

// OK when the diagram above has an edge from -> to (JOB_STATE_UNSPECIFIED is a new job);
// FAILED_PRECONDITION otherwise.
absl::Status CheckTransition(v1::JobState from, v1::JobState to);

// "PENDING", "RUNNING", ... (the enum name without its prefix).
std::string JobStateName(v1::JobState state);

// One rank of a placed job: `rank` of replica `replica` (Job::ranks holds them replica by
// replica, at Plan::TaskIndex(replica, rank)).
struct RankSlot {
  int rank = 0;
  int replica = 0;
  std::string worker_id;
  std::string worker_address;
  std::vector<int> stages;
  std::vector<std::string> actions;           // assigned, lowered
  std::vector<std::string> executed_actions;  // in the latest reported step
  int64_t steps_done = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  std::map<int, int64_t> bytes_sent_to;          // by peer rank
  std::map<int, int64_t> bytes_received_from;    // by peer rank
  int64_t parameters = 0;                        // held by the rank's worker, as reported
  int64_t reduction_bytes_sent = 0;              // by its data-parallel group, over all steps
  double reduction_hidden_ratio = 0.0;           // of its latest step
  double gather_hidden_ratio = 0.0;              // of its latest step's all-gathers (ZeRO-3)
  int64_t held_parameter_bytes = 0;              // after its latest step, measured
  int64_t held_gradient_bytes = 0;               // after its latest step, measured
  int64_t peak_live_bytes = 0;                   // its process's peak in its latest step
  std::map<int, std::string> parameter_digests;  // latest reported, by stage
  bool task_ended = false;                       // ReportTaskEnd received, or the task was stopped
  bool replica_lost = false;  // its replica left the job (it carries on: ReplicaHealth)
  // The first step (of the attempt's count) it reports: 0, or where its healed replica rejoined.
  int64_t first_step = 0;
  v1::TaskOutcome outcome = v1::TASK_OUTCOME_UNSPECIFIED;
  std::string error;
};

// Reports of one step, until every rank has sent its own.
struct StepAggregate {
  // Tasks (Plan::TaskIndex) that reported the step.
  std::set<int> tasks_reported;
  // The global batch's microbatch losses by replica slice (ReportStepRequest.slices; slice s is
  // replica s's share when every replica is healthy), from the ranks that own the last stage,
  // or from the settled step (SettleStep) when they carry on.
  std::map<int, std::vector<double>> replica_losses;
  // Every microbatch's loss in global microbatch order (replica by replica), once complete.
  std::vector<double> microbatch_losses;
  absl::Duration slowest = absl::ZeroDuration();
  std::vector<double> bubble_ratios;           // indexed by task (Plan::TaskIndex)
  std::vector<double> hidden_ratios;           // of the gradient reduction, by task; with replicas
  std::vector<int64_t> peak_activation_bytes;  // measured, by task; 0 where not measured
  // Parameter digests reported with the step (replicas): stage -> (first replica, digest).
  std::map<int, std::pair<int, std::string>> digests;
  // Set when two replicas of a stage reported different digests: what differs.
  std::string divergence;
  bool client_batch = false;  // a StepJob step
  // The training recipe's decisions (the same from every rank; taken from the first report).
  bool has_recipe = false;
  double learning_rate = 0.0;
  std::optional<double> grad_norm;
  bool skipped = false;
  std::vector<int> nonfinite_ranks;
  // A validation pass ran after the step: each replica's last stage's microbatch losses.
  bool evaluated = false;
  std::map<int, std::vector<double>> replica_eval_losses;
  // With the loss normalised by tokens: the tokens each of those microbatches counted.
  std::map<int, std::vector<int64_t>> replica_eval_tokens;
  // Token data: what each task owning the last stage counted and computed (by task).
  std::map<int, std::pair<int64_t, int64_t>> counted_and_computed;
};

// Which part of a job's per-step history (losses, bubble ratios, skipped steps, evals) and of
// its state transitions a view of the job carries (GetJobRequest's history fields).
struct HistoryWindow {
  int64_t first_step = 0;    // job step (index into Job::losses) of the first step shown
  int64_t steps = -1;        // steps shown from first_step; -1 for all
  int64_t transitions = -1;  // the latest transitions shown; -1 for all
  bool latest = false;       // first_step is ignored: the latest `steps` steps

  static HistoryWindow All() { return {}; }
  // The default view of GetJob: the latest 100 steps and transitions.
  static HistoryWindow Summary() { return {0, 100, 100, true}; }
  // Up to `steps` steps from job step `first_step`, and the latest 100 transitions.
  static HistoryWindow Page(int64_t first_step, int64_t steps) {
    return {first_step, steps, 100, false};
  }
};

// Guarded by the job table's lock (JobTable::mu()), except `control_mu`.
struct Job {
  std::string id;
  spec::JobSpec spec;
  std::string spec_yaml;
  Plan plan;
  // For a `schedule.kind: auto` job, the plan search's choice (the chosen plan and its
  // runner-up); unset otherwise.
  std::optional<v1::PlanChoice> plan_choice;
  absl::Time created;

  // Written only by TransitionTo.
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
  std::vector<v1::JobTransition> history;

  int attempt = 0;  // incremented each time the job is placed
  // Global step where the current attempt started (the checkpoint it restored, else base_step).
  int64_t attempt_base = 0;
  // Global step at which the job ends: base_step + training.steps (+ RunSteps extensions).
  int64_t finish_step = 0;
  // Global step where the ranks hold (PAUSED there) or will hold; -1 for none.
  int64_t hold_step = -1;
  // A PauseJob is choosing its hold step (its ControlTask calls are in flight): the job neither
  // finishes nor turns PAUSED meanwhile.
  bool pausing = false;
  // The ranks were told to finish at finish_step (no more RunSteps extensions).
  bool finishing = false;
  // Restarts so far (restart.max_restarts), and the root cause of the latest failure.
  int restarts = 0;
  std::optional<v1::JobFailure> failure;
  // The checkpoint the current attempt restored (the latest one when it was placed); unset when
  // it started from the model's initial parameters.
  std::optional<v1::JobCheckpoint> restored;
  // The in-memory snapshots its workers hold (training.snapshot), and the step of the one the
  // current attempt started from (-1: it did not start from one).
  SnapshotCopies snapshots;
  int64_t restored_snapshot = -1;
  // Idle workers held for the job (placement.spares), by id.
  std::vector<std::string> spare_workers;
  // restart.elastic (coordinator/elastic/): while the job runs re-planned on fewer workers,
  // `spec`, `spec_yaml` and `plan` are the re-plan's and `own` keeps the job's own; a re-plan
  // is being made off the lock (placement waits for it); and the files each stage of the
  // current plan reads from the checkpoint after `relayout_step` (written on another layout).
  struct Elastic {
    struct Own {
      std::string spec_yaml;
      spec::JobSpec spec;
      Plan plan;
    };
    std::optional<Own> own;
    bool replanning = false;
    // A re-plan on this many free workers found no plan: not tried again on as many.
    int refused_workers = -1;
    int64_t relayout_step = -1;
    std::vector<std::vector<v1::StageCheckpointFile>> relayout_files;
    bool relayout_by_name = false;
    // The same for the latest in-memory snapshot when it was taken on another layout than the
    // plan's (a shrink continues from it): the old stages' files each stage reads, by name.
    int64_t relayout_snapshot_step = -1;
    std::vector<std::vector<v1::StageCheckpointFile>> relayout_snapshot_files;
    bool shrunk() const { return own.has_value(); }
  } elastic;
  // A spare that took a rank or was lost.
  void ForgetSpare(const std::string& worker_id) {
    spare_workers.erase(std::remove(spare_workers.begin(), spare_workers.end(), worker_id),
                        spare_workers.end());
  }
  // A StepJob in flight: its global step, and what the ranks reported for it.
  struct ClientStepState {
    int64_t global_step = 0;
    bool forward_only = false;
    int64_t rows = 0;        // of the client's inputs
    int ranks_reported = 0;  // forward-only steps: ranks that reported it
    absl::Duration slowest = absl::ZeroDuration();
    std::optional<v1::TensorData> outputs;
    // Forward-only: each replica's last stage's outputs until all are in (then `outputs`).
    std::map<int, v1::TensorData> replica_outputs;
    std::vector<double> losses;
    // The step's loss as the job records it (the mean of `losses`, or their sum when the loss
    // is normalised by tokens); unset for a skipped step.
    std::optional<double> loss;
    bool done = false;
  };
  std::optional<ClientStepState> client_step;
  // Fine-tuning records as the workers read them (ReportStepRequest.data_records).
  std::optional<v1::DataRecords> data_records;
  bool starting = false;  // StartTask calls of the current attempt are in flight
  // Reloaded after a coordinator restart and not planned again yet (recovery.h): its plan only
  // describes it and its checkpoints are unchecked; placement waits for it.
  bool recovering = false;
  // Checkpoints whose manifest is being written (checkpoint collection, off the lock): the job
  // succeeds, and a restart is placed, only once they are listed.
  int manifests_in_flight = 0;
  std::vector<RankSlot> ranks;  // empty until placed
  // The current attempt's replicas when they carry on (restart.carry_on): lost ones, the
  // membership and the settling of each step. Reset with each attempt.
  ReplicaHealth replica_health;
  // When the failure being recovered from was first reported (its recovery time runs from here
  // to the job's next completed step: RecoveryMetrics); unset when none is. By a restart: the
  // global steps done when it failed (those past the restart's checkpoint are lost).
  std::optional<absl::Time> recovering_since;
  bool recovering_by_restart = false;
  // Since when a replica has been lost (until none is).
  std::optional<absl::Time> degraded_since;
  int64_t global_done_at_failure = 0;
  std::map<int64_t, StepAggregate> partial_steps;
  int64_t steps_completed = 0;  // steps of this attempt every rank has finished
  // One per completed step since base_step (index = global step - base_step), unless
  // forward-only; a restart drops those after the checkpoint it restores.
  std::vector<double> losses;
  std::vector<double> max_bubble_ratios;  // one per completed step: the largest over ranks
  // By pipeline rank: the activation peak the workers measured in the latest completed step
  // (the most over the replicas) and the most in any step since the coordinator started
  // following the job; empty until a step reported one.
  std::vector<int64_t> measured_peak_bytes;
  std::vector<int64_t> measured_max_bytes;
  // A checkpoint was recorded before the loss of its last step: the job's record is saved
  // again once steps_done() reaches this; -1 when no save waits.
  int64_t save_at_steps_done = -1;
  // Job steps whose loss the coordinator does not have (NaN in `losses`): only when a record
  // was lost; shown as missing, never invented.
  std::vector<int64_t> missing_loss_steps;
  // Set when a completed step ends the job as FAILED: a stage's replicas held different
  // parameters, or training.max_skipped_steps steps in a row were skipped. What happened.
  std::string step_failure;
  // The training recipe's per-step decisions and validation results.
  TrainingRecord training;

  // Infer jobs (forward-only, one step on a client batch). The inputs are dropped when the job
  // ends; the outputs (from the last stage's rank) when Infer hands them to its caller.
  bool inference = false;
  v1::TensorData inference_inputs;
  std::optional<v1::TensorData> inference_outputs;
  // Each replica's outputs until every replica's last stage returned them.
  std::map<int, v1::TensorData> inference_replica_outputs;

  // Checkpoints (training.checkpoint, training.resume_from; docs/checkpoints.md).
  // The checkpoint the job resumed from, and the files of it each of the plan's stages reads
  // (indexed by the plan's stage; coordinator/checkpoints/resume_layout.h); unset / empty
  // without training.resume_from. resume_by_name: the checkpoint was written on another layout.
  std::optional<v1::JobCheckpoint> resumed_from;
  std::vector<std::vector<v1::StageCheckpointFile>> resume_files;
  bool resume_by_name = false;
  // Steps of the job's timeline before its first step: resumed_from's step, else 0. Global
  // step numbers (ReportStepRequest.global_step, checkpoint steps) count from it.
  int64_t base_step = 0;
  // Files of every complete checkpoint, by global step, then by stage (to restart from).
  std::map<int64_t, std::vector<std::vector<v1::StageCheckpointFile>>> checkpoint_stage_files;
  // Stage files reported for checkpoints that are not complete yet: global step -> stage ->
  // that stage's files.
  std::map<int64_t, std::map<int, std::vector<v1::StageCheckpointFile>>> checkpoint_files;
  // Complete checkpoints (every stage's files and the manifest written), oldest first.
  std::vector<v1::JobCheckpoint> checkpoints;

  // Global steps every rank has finished.
  int64_t global_done() const { return attempt_base + steps_completed; }
  // Steps of this job (since base_step) every rank has finished.
  int64_t steps_done() const { return global_done() - base_step; }
  bool forward_only() const { return !plan.has_backward; }

  // WatchJob's log, bounded (JobManagerOptions::max_job_events).
  EventLog events;
  // Action timings of the latest steps, by global step (GetStepTrace).
  StepTraceStore traces;
  // The latest traced step replayed (BalanceToProto), kept until a later step is traced.
  mutable MeasuredBalance balance;
  // Its ranks' progress beacons, stall condition and stragglers (coordinator/diagnosis/).
  JobDiagnosis diagnosis;

  // Serialises the job's step control (StepControl): held across calls to its workers and a
  // client step's wait, never with the job table's lock held, so a stuck job delays only its
  // own control. Shared so that a caller can hold it while the table drops the job.
  std::shared_ptr<absl::Mutex> control_mu = std::make_shared<absl::Mutex>();

  // Moves to `to` if the state machine allows it, recording history and a state-change event.
  // Reaching a final state releases action lists over kKeptPlanBytes (plan_memory.h).
  absl::Status TransitionTo(v1::JobState to, const std::string& why, absl::Time now);

  // Frees what only a live job needs and the bulk of its plan (plan_memory.h): the lowered
  // action lists, each rank's assigned and executed actions, steps still being reported. Its
  // status, history, stages and predictions stay; GetJobSchedule says the lists are gone.
  void ReleaseActionLists();
  // Set by ReleaseActionLists.
  bool actions_released = false;

  // Appends an event (sequence numbers from 0).
  void AddEvent(v1::JobEvent event, absl::Time now);

  // When the job reached its final state; nullopt while it is not final.
  std::optional<absl::Time> FinishedTime() const;

  // Key prefix of the current attempt in the rendezvous store.
  std::string RendezvousPrefix() const;

  // What ToProto writes besides the history window: everything, or a ListJobs row's parts
  // (neither the spec text nor the ranks' action lists, which grow with the job).
  enum class Detail { kFull, kSummary };
  // The job (state, steps, ranks and their counters, spec, checkpoints) with the part of its
  // history `window` selects.
  void ToProto(v1::Job* out, const HistoryWindow& window = HistoryWindow::All(),
               Detail detail = Detail::kFull) const;
  // Job.ranks: each rank's slot, with its assigned and executed actions when `actions`.
  void RanksToProto(v1::Job* out, bool actions) const;
  // Job.memory: the plan's predicted memory per rank and what the workers measured.
  void MemoryToProto(v1::Job* out) const;
  // Job.stall (while RUNNING), stragglers and pace from `diagnosis`.
  void DiagnosisToProto(v1::Job* out) const;
  // The job as GetJob returns it (with `window`) and, whole, as the job table stores it:
  // ToProto plus the plan's layers and stages.
  void ToRecord(v1::Job* out, const HistoryWindow& window = HistoryWindow::All()) const;
  // ToProto without the parts that grow with the job (spec text, action lists, per-step history
  // but the latest loss, state transitions): a ListJobs row.
  void ToSummary(v1::Job* out) const;
  // Job.balance (rank_balance.h): the plan's prediction per rank and the latest step replica 0's
  // ranks all traced, replayed once per such step. GetJob's, not the record's (the measured
  // figures are transient).
  void BalanceToProto(v1::Job* out) const;
};

}  // namespace stagecoach::coordinator
