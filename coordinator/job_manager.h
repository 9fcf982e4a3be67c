// The coordinator's core: validates and plans submitted jobs, queues them with gang semantics
// (all ranks of a job start together or it waits), hands tasks to workers, follows their
// reports, detects lost workers, and keeps each job's state, history and event log.
//
// Scheduling is strict FIFO: the oldest pending job is placed first, and a later job waits
// behind it even if it would fit, so a large job cannot be starved by a stream of small ones.
//
// Locking: one mutex guards the registry and the jobs. Calls to workers (StartTask, StopTask,
// probes) run on a work queue without the lock and report back under it.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/util/clock.h"
#include "common/util/work_queue.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/job.h"
#include "coordinator/job_store.h"
#include "coordinator/kv_store.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::coordinator {

struct JobManagerOptions {
  // A worker that sends no heartbeat for this long is declared lost.
  absl::Duration lease = absl::Seconds(10);
  // How often workers are told to heartbeat; must be well below `lease`.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // Bound on each StartTask / StopTask call to a worker.
  absl::Duration worker_rpc_timeout = absl::Seconds(10);
  // Bound on the call that checks whether a worker suspected lost still answers.
  absl::Duration probe_timeout = absl::Seconds(2);
  // Bound on every data-plane wait inside a task (handed to workers with their tasks).
  absl::Duration comm_timeout = absl::Seconds(60);
  // How often leases are checked and pending jobs retried by the background thread.
  absl::Duration tick_interval = absl::Milliseconds(100);
  // Threads calling workers concurrently.
  int worker_call_threads = 8;
  // Bound on the InspectModel call that gives the planner a TorchScript model's layers (or
  // profiles a model's layers for split.policy profiled).
  absl::Duration inspect_timeout = absl::Seconds(120);
  // Timed repetitions of each layer when profiling; 0 lets the worker choose (3).
  int profile_iterations = 0;
  // Longest a task holds at a step boundary (a PAUSED job) before it gives up and fails
  // (TaskAssignment.hold_timeout).
  absl::Duration hold_timeout = absl::Hours(24);
};

struct JobManagerDeps {
  Clock* clock = Clock::Real();
  WorkerClient* workers = nullptr;  // required
  KvStore* kv = nullptr;            // required
  // Optional: where steps, bytes and job/worker counts are recorded (the counts each Tick).
  CoordinatorMetrics* metrics = nullptr;
  // Optional: the job table on disk (--data-dir). Jobs are saved on every state change,
  // checkpoint and step target change, and Recover() reloads them.
  JobStore* store = nullptr;
};

// Events of a job from a sequence number on, and whether the job has ended (no more events).
struct JobEvents {
  std::vector<v1::JobEvent> events;
  bool ended = false;
};

// What an Infer job returned.
struct InferenceResult {
  std::string job_id;
  // The last stage's outputs of every microbatch, concatenated along dim 0.
  v1::TensorData outputs;
};

// Thread-safe.
class JobManager {
 public:
  JobManager(JobManagerOptions options, JobManagerDeps deps);
  // Stops the background thread and waits for in-flight worker calls.
  ~JobManager();

  // Starts the background thread (lease expiry, scheduling). Tests may call Tick() instead.
  void Start();

  // Reloads the job table from deps.store (call before Start). Final jobs come back as they
  // were. Jobs that were PENDING stay queued. Jobs that were STARTING, RUNNING, PAUSED or
  // RESTARTING go RESTARTING ("the coordinator restarted"; not counted against
  // restart.max_restarts) and continue from their latest checkpoint once enough workers have
  // registered again, holding where they held. An Infer job that had not ended FAILS (its
  // client's batch was not kept). Returns the problems met (unreadable records, specs or
  // checkpoints), each naming the job or file; the rest is still loaded.
  std::vector<std::string> Recover() ABSL_LOCKS_EXCLUDED(mu_);

  // --- Clients ---

  // Parses, validates and plans the spec, then queues the job. INVALID_ARGUMENT (naming the
  // field path) when the spec is invalid or cannot be planned; nothing is queued then.
  // A TorchScript model, or split.policy profiled, is first inspected by a live worker (an idle
  // one of the spec's device if any; see InspectModel): FAILED_PRECONDITION when no worker is
  // registered and alive, INVALID_ARGUMENT with the worker's message when it cannot load or run
  // the model, UNAVAILABLE / DEADLINE_EXCEEDED (options.inspect_timeout) when it does not answer.
  // With `start_paused` the job's ranks set up and hold before its first step (PAUSED).
  absl::StatusOr<std::string> SubmitJob(const std::string& spec_yaml, const std::string& origin,
                                        bool start_paused = false);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Every job, oldest first, without its spec and per-rank action lists (GetJob has them).
  std::vector<v1::Job> ListJobs();
  // Forward-only inference on a client batch (CoordinatorService.Infer): plans `spec_yaml` as a
  // ForwardOnly job of one step whose batch is `inputs` (see InferRequest for which spec fields
  // apply), queues it like SubmitJob, waits up to `timeout` for it to end and returns its
  // outputs. As for SubmitJob, a TorchScript model or split.policy profiled is first inspected
  // by a worker (profiled on the spec's own data section; data does not otherwise apply).
  // `caller_gone` (optional) is polled while waiting. Errors: INVALID_ARGUMENT naming the field
  // (`inputs...`, `schedule.microbatches`, a spec path) when nothing was queued; DEADLINE_EXCEEDED
  // after `timeout`, CANCELLED when `caller_gone` said so (the job is cancelled in both cases);
  // ABORTED with the reason of a job that FAILED, CANCELLED for one cancelled by CancelJob;
  // UNAVAILABLE when the manager shuts down. Each names the job.
  absl::StatusOr<InferenceResult> Infer(const std::string& spec_yaml, const std::string& origin,
                                        v1::TensorData inputs, absl::Duration timeout,
                                        const std::function<bool()>& caller_gone = nullptr);
  // Checkpoint on demand (CoordinatorService.CheckpointJob): asks every rank's worker to write
  // a checkpoint after the earliest step no rank has finished (a later one when a worker has
  // already passed it, a few times), and returns that global step and the checkpoint's
  // directory; the checkpoint is complete once GetJob lists it in `checkpoints`. A job that has
  // run all its steps answers with its final checkpoint, which it writes anyway.
  // A PAUSED job writes the state it holds, at its current global step, and stays PAUSED.
  // FAILED_PRECONDITION when the job is not RUNNING or PAUSED, is forward-only or has no
  // training.checkpoint.dir; NOT_FOUND for an unknown job; ABORTED when the workers kept
  // passing the step asked for; a worker's own error (naming its rank) otherwise.
  absl::StatusOr<v1::CheckpointJobResponse> CheckpointJob(const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Step control (CoordinatorService.PauseJob, ResumeJob, RunSteps, StepJob; see their
  // contracts in coordinator.proto).
  absl::StatusOr<v1::PauseJobResponse> PauseJob(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::Job> ResumeJob(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::RunStepsResponse> RunSteps(const std::string& job_id, int64_t steps)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for the step; `caller_gone` (optional) is polled meanwhile.
  absl::StatusOr<v1::StepJobResponse> StepJob(const v1::StepJobRequest& request,
                                              absl::Duration timeout,
                                              const std::function<bool()>& caller_gone = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The job's planned schedule (CoordinatorService.GetJobSchedule).
  absl::StatusOr<v1::GetJobScheduleResponse> GetJobSchedule(const std::string& job_id);
  // The measured Chrome trace of a completed step; -1 for the latest (GetStepTrace).
  absl::StatusOr<v1::GetStepTraceResponse> GetStepTrace(const std::string& job_id,
                                                        int64_t global_step);
  // FAILED_PRECONDITION when the job has already ended.
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason);
  // Waits up to `timeout` for events with sequence >= from_sequence; returns those (possibly
  // none) and whether the job has ended.
  absl::StatusOr<JobEvents> WaitForEvents(const std::string& job_id, int64_t from_sequence,
                                          absl::Duration timeout);
  std::vector<v1::WorkerInfo> ListWorkers();

  // --- Workers ---

  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const v1::RegisterWorkerRequest& req);
  absl::Status Heartbeat(const v1::HeartbeatRequest& req);
  absl::Status ReportStep(const v1::ReportStepRequest& req);
  absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest& req);

  // One round of background work: expire leases (failing the jobs of lost workers) and place
  // pending jobs on free workers.
  void Tick();

 private:
  // The model's layers to plan `spec` by: from the spec for a built-in model, else from a live
  // worker's InspectModel of `inspect_yaml` (profiled when split.policy is profiled). Takes the
  // lock only to pick the worker; the call runs without it. Errors: see SubmitJob.
  absl::StatusOr<std::vector<v1::LayerInfo>> ModelLayers(const spec::JobSpec& spec,
                                                         const std::string& inspect_yaml,
                                                         const PlanOptions& plan_options)
      ABSL_LOCKS_EXCLUDED(mu_);
  Job* FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job*> FindJobOrError(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a parsed and planned job as PENDING (the caller then calls ScheduleLocked).
  Job& AddJobLocked(spec::JobSpec spec, std::string spec_yaml, Plan plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `job` ends, `timeout` passes or `caller_gone`; see Infer.
  absl::StatusOr<InferenceResult> AwaitInferenceLocked(Job* job, absl::Duration timeout,
                                                       const std::function<bool()>& caller_gone)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places pending jobs in FIFO order while workers are free.
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls StartTask for every rank of `job_id`'s attempt (on the work queue).
  void StartTasks(const std::string& job_id, int attempt,
                  std::vector<std::pair<std::string, v1::TaskAssignment>> tasks);
  // Ends a job that is not final yet: records the transition, stops its live tasks and
  // releases its workers.
  void EndJobLocked(Job* job, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops one rank's task on its worker and releases the worker (on the work queue).
  void StopRankLocked(const Job& job, const RankSlot& slot, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks a worker lost and fails the job it was running, naming it and its rank.
  void LoseWorkerLocked(const std::string& worker_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a rank reported a failure: probes the job's other workers so that a lost worker,
  // not its symptom on a peer, is named as the root cause; then fails the job.
  void InvestigateFailure(const std::string& job_id, int attempt, int rank,
                          const std::string& error);
  // Records the checkpoint files of a step report (already validated); when every stage's files
  // of that global step have arrived, checks they are on disk, writes the manifest last and
  // lists the checkpoint in the job. A checkpoint that cannot be completed is logged, not
  // listed (it stays a partial checkpoint, which a resume refuses).
  void CollectCheckpointFilesLocked(Job* job, const v1::ReportStepRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the metrics' job and worker counts from the current table (when deps_.metrics).
  void UpdateStateMetricsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Handles the failure of a job that is not final (root cause in `failure`): RESTARTING when
  // restart.max_restarts allows one more attempt (RestartLocked), else FAILED.
  void FailOrRestartLocked(Job* job, v1::JobFailure failure, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the job to RESTARTING: stops its live tasks; ScheduleLocked places it again once its
  // workers are released and enough are free.
  void RestartLocked(Job* job, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A control call to `rank` failed with `error` while `doing` (e.g. "pausing job-3"): the
  // job fails or restarts, naming the rank and its worker.
  void ControlFailedLocked(Job* job, int rank, const absl::Status& error, const std::string& doing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Turns a RUNNING job PAUSED once every rank holds at its hold step.
  void MaybePauseLocked(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the ranks of a RUNNING job that every rank brought to finish_step (and that holds
  // nowhere else) to finish.
  void MaybeFinishLocked(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `requests[r]` to rank r's worker, each on the work queue; a failed call fails (or
  // restarts) the job, naming the rank.
  void SendControlLocked(Job* job, std::vector<v1::ControlTaskRequest> requests)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `requests[r]` to every rank now, in rank order, and returns the first error (naming the
  // rank) and that rank. Takes no lock: the caller holds control_mu_.
  absl::Status CallControl(const std::vector<std::pair<int, std::string>>& ranks,
                           const std::vector<v1::ControlTaskRequest>& requests, int* failed_rank);
  // The ControlTask request that sets a job's attempt's step limit.
  v1::ControlTaskRequest ControlRequest(const Job& job, int64_t step_limit) const;
  // Saves the job to deps.store (when set); an I/O error is logged.
  void PersistLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job as GetJob returns it (with the plan's layers and stages).
  v1::Job FullProtoLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A forward-only client step's report (ReportStepRequest.forward_only_step).
  absl::Status ReportForwardOnlyStepLocked(Job* job, RankSlot* slot,
                                           const v1::ReportStepRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // CheckpointJob of a PAUSED job: every rank writes the state it holds (ControlTask with the
  // held step as a checkpoint step; the ranks answer with checkpoint_only reports).
  absl::StatusOr<v1::CheckpointJobResponse> CheckpointPausedJob(const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mu_, control_mu_);

  // Validates that a report comes from the worker holding `rank` in the current attempt.
  absl::StatusOr<RankSlot*> ReportingSlot(Job* job, const std::string& worker_id, int attempt,
                                          int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobManagerOptions options_;
  const JobManagerDeps deps_;

  // Serialises the step-control calls (PauseJob, ResumeJob, RunSteps, StepJob), which call
  // workers without holding mu_. Acquired before mu_, never while holding it.
  absl::Mutex control_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  WorkerRegistry registry_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);  // oldest first; deque keeps pointers stable
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread ticker_;
  // Declared last: destroyed first, so queued worker calls finish while members still exist.
  std::unique_ptr<WorkQueue> calls_;
};

}  // namespace stagecoach::coordinator
