// The coordinator's core, as one facade over its components (docs/architecture.md):
//
//   admission            spec -> inspected model -> plan, or a refusal naming the field
//   placement            gang placement in strict FIFO order, the PENDING reason
//   task_assignment      what StartTask carries for each rank
//   job_table            jobs under one lock, ids, paging, retention; job_writer/job_store
//                        persist them off that lock
//   step_aggregation     step reports -> losses, events, traces, metrics
//   checkpoint_collection  stage files -> manifest (disk I/O off the lock), resume checks
//   step_control         pause/resume/run/step/checkpoint, serialised per job
//   job_lifecycle        start, end, restart policy, failures; failure_investigation names
//                        the root cause; recovery rebuilds jobs after a coordinator restart
//   worker_registry      workers, leases and heartbeats, under a lock of its own
//
// JobManager routes each RPC to its component and owns the background tick (lease expiry,
// retention, placement retries, state metrics). Locks: a job's control lock, then the job table's
// lock, then the registry's; no disk write or remote call happens under the job table's or the
// registry's lock (they run on the injected executor). Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/util/clock.h"
#include "common/util/executor.h"
#include "coordinator/checkpoints/checkpoint_collection.h"
#include "coordinator/control/step_aggregation.h"
#include "coordinator/control/step_control.h"
#include "coordinator/control/step_settlement.h"
#include "coordinator/diagnosis/progress_inbox.h"
#include "coordinator/jobs/job.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/jobs/job_writer.h"
#include "coordinator/lifecycle/admission.h"
#include "coordinator/lifecycle/job_lifecycle.h"
#include "coordinator/lifecycle/placement.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/workers/kv_store.h"
#include "coordinator/workers/worker_client.h"
#include "coordinator/workers/worker_registry.h"
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
  // Bound on the InspectModel call that gives the planner a TorchScript model's layers (or
  // profiles a model's layers for split.policy profiled).
  absl::Duration inspect_timeout = absl::Seconds(120);
  // Timed repetitions of each layer when profiling; 0 lets the worker choose (3).
  int profile_iterations = 0;
  // What a submitted spec may ask for (--max-layers, --max-stages, ...: docs/spec.md
  // "Limits"), and the bound on planning it (--plan-timeout).
  spec::SpecLimits limits;
  absl::Duration plan_timeout = absl::Seconds(60);
  // What the plan search assumes a message between workers costs (--plan-message-latency,
  // --plan-link-bandwidth).
  CostAssumptions plan_costs = DefaultCostAssumptions();
  // Longest a task holds at a step boundary (a PAUSED job) before it gives up and fails
  // (TaskAssignment.hold_timeout).
  absl::Duration hold_timeout = absl::Hours(24);
  // The stall rule (--stall-after; coordinator/diagnosis/stall_rule.h): its silent_after is set
  // from heartbeat_interval by the daemon. And the straggler rule (--straggler-threshold,
  // --straggler-window; straggler_rule.h).
  StallOptions stall;
  StragglerOptions stragglers;
  // Retention of finished jobs (SUCCEEDED, FAILED, CANCELLED), in memory and in the job table
  // on disk: at most `retain_finished_jobs` of them (the most recently finished), none that
  // finished longer than `retain_finished_for` ago (--retain-finished-jobs,
  // --retain-finished-for).
  int retain_finished_jobs = 1000;
  absl::Duration retain_finished_for = absl::Hours(7 * 24);
  // Events a job's log keeps (WatchJob); older ones are dropped, and a watcher that asks for
  // them is told so (--max-job-events).
  int max_job_events = 10000;
  // Bound on the bytes all live jobs' plans hold (jobs/plan_memory.h); a job that would take
  // them over it is refused (--max-plan-memory). <= 0: no bound.
  int64_t max_plan_memory_bytes = 0;
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
  // Required: runs calls to workers and disk writes off the locks (WorkQueue in the daemon,
  // ManualExecutor in tests). Must outlive the manager.
  Executor* executor = nullptr;
};

// Events of a job from a sequence number on, and whether the job has ended (no more events).
struct JobEvents {
  std::vector<v1::JobEvent> events;
  bool ended = false;
  // Events [dropped_from, dropped_to) were asked for but the job's log no longer keeps them
  // (JobManagerOptions::max_job_events); `events` starts at dropped_to. Both 0 otherwise.
  int64_t dropped_from = 0;
  int64_t dropped_to = 0;
};

// What an Infer job returned.
struct InferenceResult {
  std::string job_id;
  // The last stage's outputs of every microbatch, concatenated along dim 0.
  v1::TensorData outputs;
};

// Where a PAUSED job's stages run (its first replica), for a generation session's decoding
// steps (WorkerService.Decode).
struct DecodeRoute {
  std::string job_id;
  int attempt = 0;
  // Indexed by stage: the address of the worker that runs it.
  std::vector<std::string> stage_addresses;
};

class JobManager : private LifecycleHooks {
 public:
  JobManager(JobManagerOptions options, JobManagerDeps deps);
  // Stops the background thread; queued work of the manager's that has not started is dropped,
  // running work is waited for, and queued job records are written.
  ~JobManager() override;

  // Starts the background thread (Tick every options.tick_interval). Tests may call Tick().
  void Start();

  // Reloads the job table from deps.store (call before Start). It reads the records only and
  // returns at once: final jobs come back as they were; jobs that had not ended are planned
  // again (with their recorded partition) and their checkpoints checked in the background
  // (recovery.h), and wait in the queue meanwhile. Jobs that were PENDING stay queued. Jobs that
  // were STARTING, RUNNING, PAUSED or RESTARTING go RESTARTING ("the coordinator restarted"; not
  // counted against restart.max_restarts) and continue from their latest checkpoint once enough
  // workers have registered again, holding where they held. An Infer job that had not ended
  // FAILS (its client's batch was not kept), as does a job that no longer plans. Returns the
  // problems met reading records (unreadable ones, specs, histories), each naming the job or
  // file; the rest is still loaded. Checkpoints that do not verify are logged.
  std::vector<std::string> Recover();

  // --- Clients ---

  // Admits (Admission::AdmitTraining: its errors) and queues the job. With `start_paused` the
  // job's ranks set up and hold before its first step (PAUSED).
  // Admission stops as soon as `caller_gone` (when set) returns true.
  absl::StatusOr<std::string> SubmitJob(const std::string& spec_yaml, const std::string& origin,
                                        bool start_paused = false,
                                        const std::function<bool()>& caller_gone = nullptr);
  // The plan search for a spec (Admission::SearchPlans: its errors), for `stagectl plan`;
  // queues nothing.
  absl::StatusOr<SearchedPlans> SearchPlans(const std::string& spec_yaml, const std::string& origin,
                                            int64_t memory_limit_bytes,
                                            const std::function<bool()>& caller_gone = nullptr);
  // A TorchScript model's layers and split candidates (Admission::DescribeModel: its errors),
  // for `stagectl inspect`; queues nothing.
  absl::StatusOr<v1::DescribeModelResponse> DescribeModel(const std::string& torchscript,
                                                          const std::string& device);
  // The job with the part of its history `window` selects (the whole by default).
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id,
                                 const HistoryWindow& window = HistoryWindow::All());
  // Every job, oldest first, as summaries (Job::ToSummary: GetJob has the spec and action lists).
  std::vector<v1::Job> ListJobs();
  // One page of them (JobTable::List).
  absl::StatusOr<JobPage> ListJobs(int page_size, const std::string& page_token);
  // Forward-only inference on a client batch (CoordinatorService.Infer): admits `spec_yaml`
  // (Admission::AdmitInference: its errors), queues it like SubmitJob, waits up to `timeout`
  // for it to end and returns its outputs. `caller_gone` (optional) is polled while waiting.
  // DEADLINE_EXCEEDED after `timeout`, CANCELLED when `caller_gone` said so (the job is
  // cancelled in both cases); ABORTED with the reason of a job that FAILED, CANCELLED for one
  // cancelled by CancelJob; UNAVAILABLE when the manager shuts down. Each names the job.
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
  absl::StatusOr<v1::CheckpointJobResponse> CheckpointJob(const std::string& job_id);
  // Step control (CoordinatorService.PauseJob, ResumeJob, RunSteps, StepJob; see their
  // contracts in coordinator.proto and StepControl). Serialised per job.
  absl::StatusOr<v1::PauseJobResponse> PauseJob(const std::string& job_id,
                                                const std::function<bool()>& caller_gone = nullptr);
  absl::StatusOr<v1::Job> ResumeJob(const std::string& job_id);
  absl::StatusOr<v1::RunStepsResponse> RunSteps(const std::string& job_id, int64_t steps);
  // Waits up to `timeout` for the step; `caller_gone` (optional) is polled meanwhile.
  absl::StatusOr<v1::StepJobResponse> StepJob(const v1::StepJobRequest& request,
                                              absl::Duration timeout,
                                              const std::function<bool()>& caller_gone = nullptr);
  // Where the PAUSED job's stages run; FAILED_PRECONDITION naming its state when it is not
  // PAUSED, NOT_FOUND for an unknown job.
  absl::StatusOr<DecodeRoute> DecodeRouteOf(const std::string& job_id);
  // WorkerService.Decode on the worker at `address`, bounded by `timeout`.
  absl::StatusOr<v1::DecodeResponse> Decode(const std::string& address,
                                            const v1::DecodeRequest& request,
                                            absl::Duration timeout);
  // The job's planned schedule (CoordinatorService.GetJobSchedule).
  absl::StatusOr<v1::GetJobScheduleResponse> GetJobSchedule(const std::string& job_id);
  // The measured Chrome trace of a completed step; -1 for the latest (GetStepTrace).
  absl::StatusOr<v1::GetStepTraceResponse> GetStepTrace(const std::string& job_id,
                                                        int64_t global_step);
  // What each rank of the job is doing now, its stall and stragglers (DiagnoseJob;
  // job_manager_diagnosis.cc). NOT_FOUND for an unknown job.
  absl::StatusOr<v1::DiagnoseJobResponse> DiagnoseJob(const std::string& job_id);
  // FAILED_PRECONDITION when the job has already ended.
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason);
  // Waits up to `timeout` for events with sequence >= from_sequence; returns those (possibly
  // none), what of them the log no longer keeps, and whether the job has ended.
  absl::StatusOr<JobEvents> WaitForEvents(const std::string& job_id, int64_t from_sequence,
                                          absl::Duration timeout);
  std::vector<v1::WorkerInfo> ListWorkers();

  // --- Workers ---

  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const v1::RegisterWorkerRequest& req);
  // Renews the lease under the registry's lock alone; then, for the jobs whose in-memory
  // snapshots the worker holds, says which steps to keep (SnapshotKeepFrom).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);
  // A worker holds in-memory snapshot files of a job (CoordinatorService.ReportSnapshot):
  // recorded in the job's SnapshotCopies; a report of an ended job or an earlier attempt is
  // ignored. FAILED_PRECONDITION when the worker runs none of the attempt's ranks;
  // SnapshotCopies::Record's errors.
  absl::Status ReportSnapshot(const v1::ReportSnapshotRequest& req);
  absl::Status ReportStep(const v1::ReportStepRequest& req);
  absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest& req);
  // A rank of a job whose replicas carry on settles its step (StepSettlement::Settle). Waits
  // on the job table's lock's condition.
  absl::StatusOr<v1::SettleStepResponse> SettleStep(const v1::SettleStepRequest& req) {
    return settlement_.Settle(req);
  }

  // One round of background work: expire leases (failing the jobs of lost workers), drop
  // finished jobs beyond retention, place pending jobs on free workers, update state metrics.
  void Tick();

 private:
  // LifecycleHooks.
  void ScheduleLocked() override;
  void AttemptStartedLocked(Job& job) override;
  void ReplicaLostLocked(Job& job) override;

  // Queues an admitted job as PENDING (the caller then calls ScheduleLocked).
  Job& AddJobLocked(AdmittedJob admitted);
  // Waits until `job` ends, `deadline` passes or `caller_gone`; see Infer.
  absl::StatusOr<InferenceResult> AwaitInference(std::shared_ptr<Job> job, absl::Time deadline,
                                                 absl::Duration timeout,
                                                 const std::function<bool()>& caller_gone);
  // Validates that a report comes from the worker holding `rank` of `replica` in the current
  // attempt.
  absl::StatusOr<RankSlot*> ReportingSlotLocked(Job& job, const std::string& worker_id, int attempt,
                                                int rank, int replica);
  // A checkpoint-only report of a held rank (a paused job's CheckpointJob).
  absl::Status ReportCheckpointOnlyLocked(Job& job, const RankSlot& slot,
                                          const v1::ReportStepRequest& req);
  // Writes a completed checkpoint's manifest on the executor, then lists it in its job.
  void QueueManifestLocked(Job& job, PendingManifest pending);
  // Recover's background part for one job: PrepareRecovery off the lock, then ApplyRecovery and
  // FinishRecoveryLocked (what the job does next) under it.
  void QueueRecoveryLocked(Job& job);
  void FinishRecoveryLocked(Job& job, const std::string& plan_error);
  // restart.elastic (job_manager_elastic.cc, coordinator/elastic/): re-plans the restarting jobs
  // PlanResizesLocked picks, off the lock, and installs them; and a shrunk job's checkpoint
  // that lets it grow back restarts it on its own plan.
  void QueueResizesLocked();
  void MaybeGrowLocked(Job& job, const PendingManifest& pending);
  // HeartbeatResponse.snapshot_keep_from for `jobs`: a live job's SnapshotCopies::KeepFrom (0
  // when it knows of none: keep everything), -1 for an ended or unknown job.
  v1::HeartbeatResponse SnapshotKeepFrom(
      const google::protobuf::RepeatedPtrField<std::string>& jobs);
  // Sets the metrics' job and worker counts from the current table (when deps_.metrics).
  void UpdateStateMetricsLocked();
  // Diagnosis (job_manager_diagnosis.cc): the beacons heartbeats left in progress_inbox_ into
  // their jobs; the job's diagnosis started for its current attempt; the stall rule's inputs;
  // and the tick's pass over the running jobs (their STALLED condition, its events and metric).
  void TakeProgressLocked();
  void EnsureDiagnosisLocked(Job& job);
  // With `heartbeats`, each rank's worker's latest heartbeat too (a registry lookup per rank:
  // only to describe the ranks, not to decide whether the step stalled).
  StallInputs StallInputsLocked(const Job& job, bool heartbeats) const;
  void DiagnoseJobsLocked(absl::Time now);

  const JobManagerOptions options_;
  const JobManagerDeps deps_;
  WorkerRegistry registry_;
  ProgressInbox progress_inbox_;       // heartbeats' beacons, taken on each tick
  std::unique_ptr<JobWriter> writer_;  // with deps.store; outlives the table
  JobTable table_;
  Admission admission_;
  Placement placement_;
  StepAggregator aggregator_;
  JobLifecycle lifecycle_;
  StepControl control_;
  StepSettlement settlement_;
  bool stopping_ = false;  // guarded by table_.mu()
  std::thread ticker_;
  TaskScope scope_;  // declared last: closed first
};

}  // namespace stagecoach::coordinator
