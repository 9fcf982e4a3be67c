// Runs one rank of one job attempt (a TaskAssignment) from start to end: builds the rank's
// stages (task_setup.h), bootstraps the data plane through the rendezvous store, agrees shapes
// with the other ranks, runs steps with the schedule's action list, reports every step
// (step_reports.h), writes checkpoints (checkpoint_steps.h), and reports how the task ended.
//
// The step gate (step_gate.h, where its rules are stated) decides at every step boundary what
// the task does: a data step (data_steps.h), a client step (client_steps.h), a checkpoint at
// hold, the end, or a hold. The task's step_limit, finish_at_limit and checkpoint steps start as
// the assignment's (TaskAssignment.checkpoint_steps); ControlTask and RequestCheckpoint move
// them. step_limit == resume.step starts the task held (after its set-up and shape agreement).
// A hold longer than TaskAssignment.hold_timeout (24 h when unset) fails the task. A checkpoint
// is written after a training step whose new global step count is a multiple of
// training.checkpoint.every_steps or one of the requested checkpoint steps.
//
// Client steps. A training client step runs like a data step on the client's batch (stage 0's
// rank splits the inputs, the last stage's rank the targets) and counts in the timeline; a
// forward-only one runs the F, SEND_F and RECV_F actions of the rank's list (ForwardActions) on
// a forward-only executor, does not count, and the last stage's rank reports the outputs. Every
// rank agrees shapes again before a client step and before the first data step after one. On
// the rank owning stage 0, ControlTask first runs the batch through stage 0 (outside the task's
// lock, once the task is at its step boundary; the gate starts no step meanwhile), so that a
// batch stage 0 cannot take is refused with INVALID_ARGUMENT while every rank still holds.
//
// Forward-only tasks (TaskAssignment.forward_only) run F actions only: no targets, losses,
// optimizer steps or checkpoints. An Infer job's task (TaskAssignment.inference) runs one such
// step on the client's batch instead of the spec's data and then ends (whatever its step
// limit), and the rank owning the last stage returns the merged outputs in its ReportTaskEnd.
//
// This header keeps LibTorch out of its includes so the gRPC service can include it cheaply.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"
#include "stagecoach/v1/worker.pb.h"
#include "worker/collectives/collectives.h"
#include "worker/runtime/executor/message_tags.h"
#include "worker/runtime/executor/progress_beacon.h"
#include "worker/runtime/snapshot/snapshot_store.h"
#include "worker/runtime/task/step_gate.h"
#include "worker/runtime/training/replica_membership.h"
#include "worker/transport/rendezvous_store.h"
#include "worker/transport/transport.h"

namespace stagecoach::runtime {

class CheckpointSteps;
class ClientSteps;
class DataSteps;
class DecodeSessions;
class GradientReducer;
class SnapshotSteps;

struct TaskSetup;
struct TaskStages;

// Where a task's progress goes (the coordinator, in production). Thread-safe.
class TaskReporter {
 public:
  virtual ~TaskReporter() = default;
  // A step finished on this rank. Errors are logged by the caller, not fatal.
  virtual absl::Status ReportStep(const v1::ReportStepRequest& report) = 0;
  // The task ended (TaskRunner::Run's result); sent once per task by the runner's owner.
  virtual absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest& report) = 0;
};

// What a task needs from its data plane.
struct TransportRequest {
  // TaskAssignment.transport: "gloo" or "nccl".
  std::string backend;
  int rank = 0;
  int world_size = 1;
  // Rendezvous key prefix of this job attempt.
  std::string prefix;
  // Bounds the rendezvous and the connections.
  absl::Duration timeout;
  // Every stage's rank, and whether the job has a backward: which links the rank uses (NCCL
  // orders transfers per link; worker/runtime/executor/message_tags.h).
  std::vector<int> stage_to_rank;
  bool forward_only = false;
  // Producer -> consumer stage pairs that are not adjacent: skip connections of a graph-split
  // model, which have links of their own.
  std::vector<SkipPair> skips;
  // The first and last stages hold copies of one parameter (tied embeddings on different
  // stages): their ranks have a link for its gradients.
  bool tied_ends = false;
};

// Creates the data-plane transport for a task, rendezvousing through `store`.
using TransportFactory = std::function<absl::StatusOr<std::unique_ptr<transport::Transport>>(
    const TransportRequest& request, transport::RendezvousStore* store)>;

// What a task needs from its data-parallel group: the tasks of the same pipeline rank in every
// replica, which reduce that rank's stages' gradients together.
struct CollectivesRequest {
  // TaskAssignment.transport: the collectives go with the pipeline's backend (ring collectives
  // over a host-memory transport of the group, NCCL's own over device memory).
  std::string backend;
  // The task's replica, and the replica count.
  int rank = 0;
  int size = 1;
  // Rendezvous key prefix of the group (the attempt's prefix + "dp/<pipeline rank>/").
  std::string prefix;
  // Bounds the rendezvous and the connections.
  absl::Duration timeout;
};

// Creates a task's data-parallel group, rendezvousing through `store`.
using CollectivesFactory = std::function<absl::StatusOr<std::unique_ptr<collectives::Collectives>>(
    const CollectivesRequest& request, transport::RendezvousStore* store)>;

// Turns a file reference of a spec (model.torchscript, data.path) into a path on this worker:
// "artifact:<id>" is fetched from the coordinator's artifact store (and cached); anything else
// is a path on the worker's filesystem and is returned as is. Errors name the reference.
using FileResolver = std::function<absl::StatusOr<std::string>(const std::string& ref)>;

class CountingCpuAllocator;  // counting_allocator.h

struct TaskRunnerDeps {
  std::string worker_id;
  TaskReporter* reporter = nullptr;             // required
  transport::RendezvousStore* store = nullptr;  // required
  TransportFactory make_transport;              // required
  // Required by tasks of jobs with placement.replicas > 1.
  CollectivesFactory make_collectives;
  // The worker's device as runtime::CheckDevice canonicalised it: "cpu" or "cuda:N". Jobs with
  // placement.device cuda run on it; cpu jobs run on the CPU whatever it is.
  std::string device = "cpu";
  // Resolves model.torchscript and data.path; when unset, references are used as paths.
  FileResolver resolve_file;
  // The process's counting CPU allocator (a worker daemon installs it): CPU tasks report each
  // step's activation peak from it (ExecutorOptions::memory_counter). Null: not measured.
  CountingCpuAllocator* memory_counter = nullptr;
  // Required by tasks whose steps are settled (TaskAssignment.settle_steps: replicas that
  // carry on): CoordinatorService.SettleStep.
  StepSettler settle_step;
  // Required by tasks of jobs with training.snapshot, and of attempts starting from an
  // in-memory snapshot (ResumeTask.snapshot): the worker's snapshot store (it outlives the
  // task) and CoordinatorService.ReportSnapshot.
  SnapshotStore* snapshot_store = nullptr;
  SnapshotReporter report_snapshot;
  // The worker's --debug-slow-actions (ExecutorOptions::debug_slow_factor); 1: off.
  double debug_slow_factor = 1.0;
};

class TaskRunner {
 public:
  TaskRunner(v1::TaskAssignment task, TaskRunnerDeps deps);
  ~TaskRunner();

  // Runs the task to its end (reporting each step) and returns how it ended: SUCCEEDED,
  // FAILED with the error, or STOPPED after Stop. The caller sends that report, after it has
  // made the worker free for a next task, so that the coordinator never learns of a free
  // worker that would still refuse one. Blocking; call once.
  v1::ReportTaskEndRequest Run();

  // Asks Run to stop soon: pending rendezvous and data-plane waits return at once. Thread-safe.
  void Stop(const std::string& reason);

  // Asks the task to write a checkpoint after the step that brings the job's timeline to
  // `global_step` steps (its files then go with that step's report). Honoured when the task
  // reaches that step; FAILED_PRECONDITION when it has already done that many steps. Requests
  // add up: each adds a step to the set of checkpoint steps. Thread-safe.
  absl::Status RequestCheckpoint(int64_t global_step);

  // Steers the task at step boundaries (WorkerService.ControlTask, whose semantics it
  // implements, through StepGate::Apply): replaces the step limit and finish_at_limit (always: a
  // request that only adds checkpoint steps repeats the current ones), adds checkpoint steps
  // (steps the task has already passed are ignored) and hands over at most one client step (a
  // request without one withdraws a pending one that has not started). Returns the global
  // steps done when the request was taken. FAILED_PRECONDITION (naming job, rank and steps) for
  // another job or attempt, an Infer job's task, a task that has ended or is finishing, a
  // step_limit below the steps done (or below done + 1 while a step runs), a client step when
  // the task does not hold at exactly client_step.global_step or one is already pending or being
  // checked, a training client step on a forward-only task, and a client step overtaken by
  // another ControlTask or Stop while stage 0 checked it; INVALID_ARGUMENT naming the field for a
  // malformed client step or one stage 0 cannot take; DEADLINE_EXCEEDED when the task's thread
  // does not come back to its step boundary within comm_timeout for that check. Nothing changes
  // on an error. Thread-safe; never waits for a step. With a client step, on the rank owning
  // stage 0, it waits for the task to reach its step boundary (the end of its set-up, or of the
  // last step's checkpoint and report), then for stage 0's run on the batch.
  absl::StatusOr<v1::ControlTaskResponse> ControlTask(const v1::ControlTaskRequest& request);

  // Runs one decoding step of a generation session on one of the rank's stages, or ends the
  // session (WorkerService.Decode, whose semantics it implements, through
  // generation/decode_sessions.h): only while the task holds (StepGate::RunHeld). The session's
  // caches live until end_session, the task's end, or 10 minutes without a request.
  // FAILED_PRECONDITION for another job or attempt, a stage the rank does not run, a task that
  // does not hold or has no stages yet; INVALID_ARGUMENT naming the field. Thread-safe.
  absl::StatusOr<v1::DecodeResponse> Decode(const v1::DecodeRequest& request);

  // What the task's rank is doing now (executor/progress_beacon.h), for the worker's heartbeat.
  // Thread-safe.
  v1::RankProgress Progress() const { return progress_.Read(); }

  const v1::TaskAssignment& task() const { return task_; }
  int64_t steps_done() const { return steps_done_.load(); }

 private:
  // Sets up, connects the data plane, runs the steps; the task's end.
  absl::Status RunSteps();
  // The steps on a connected data plane (and dp_group_, if any), until the gate ends the task;
  // then the final barrier (or, after an error, Abort).
  absl::Status RunOnDataPlane(TaskSetup& setup, transport::Transport& transport);
  // Replicas that carry on: a new data-parallel group of `group_size` healthy replicas in which
  // this task is `group_rank`, for membership `epoch` (replica_membership.h's Regroup), handed
  // to `reducer` and to Stop; this task writes the checkpoints when it is the group's rank 0.
  absl::Status Regroup(const MembershipChange& change, TaskSetup& setup,
                       transport::Transport& transport, GradientReducer& reducer,
                       CheckpointSteps& checkpoints);
  // A replacement rank (TaskAssignment.join): waits to join, takes the state from the donor
  // and starts its timeline where it joins.
  absl::Status JoinRunningJob(ReplicaMembership& membership);
  // In-memory snapshots (training.snapshot): connects the snapshot transport (the attempt's
  // ranks, when there are several) and, when the attempt starts from a snapshot, exchanges its
  // files and restores the stages from them (snapshot/snapshot_restore.h).
  absl::Status ConnectSnapshots(TaskSetup& setup);
  // The gate's decisions, each run, until it finishes the task or one fails.
  absl::Status StepLoop(DataSteps& data, ClientSteps& client_steps, CheckpointSteps& checkpoints);
  // Makes the data plane (its data-parallel group, if any) and the stages known to Stop and
  // ControlTask (nullptr: forgets them).
  void UseDataPlane(transport::Transport* transport, collectives::Collectives* group,
                    std::shared_ptr<TaskStages> stages);
  // ControlTask's check of a client step's batch on stage 0, on the rank owning it (none on
  // the others). It runs when the gate lets it: at the task's step boundary, after its set-up.
  StepGate::Check Stage0Check(const StepGate::ClientStep& client);

  const v1::TaskAssignment task_;
  TaskRunnerDeps deps_;
  // Infer jobs, on the rank owning the last stage: the merged outputs, for ReportTaskEnd.
  // Written by RunSteps and read by Run, on Run's thread.
  std::optional<v1::TensorData> inference_outputs_;
  // The task's count of counted steps.
  std::atomic<int64_t> steps_done_{0};
  StepGate gate_;
  // Marked by the executor and the step parts (StepEnv::progress); read by Progress.
  ProgressBeacon progress_;

  // Guards what Stop and ControlTask reach of the task's thread's objects. Taken before the
  // gate's lock, never across a wait.
  absl::Mutex mu_;
  // The transport in use, so that Stop can abort it; owned by RunSteps.
  transport::Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The data-parallel group in use, so that Stop can abort it; owned by RunSteps.
  collectives::Collectives* group_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The snapshot transport, so that Stop can abort it; owned by snapshot_transport_.
  transport::Transport* snapshot_abort_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The rank's stages while RunSteps has them: a client step's check runs a batch through
  // stage 0, and a generation session's decoding step through a stage (the gate lets them only
  // while the task holds); they share the stages, so that they outlive work that a task ending
  // meanwhile does not wait for.
  std::shared_ptr<TaskStages> held_stages_ ABSL_GUARDED_BY(mu_);
  // The generation sessions' caches (Decode); cleared when the task ends.
  std::unique_ptr<DecodeSessions> decode_sessions_;
  // The task's data-parallel group (replicas > 1), replaced by Regroup; the task's thread's.
  std::unique_ptr<collectives::Collectives> dp_group_;
  // In-memory snapshots: their transport and the steps that take them (training tasks of jobs
  // with training.snapshot); the task's thread's.
  std::unique_ptr<transport::Transport> snapshot_transport_;
  std::unique_ptr<SnapshotSteps> snapshots_;
  // The rendezvous store wrapper in use, so that Stop can cancel its waits.
  class CancellableStore;
  std::unique_ptr<CancellableStore> store_;
};

}  // namespace stagecoach::runtime
