// Runs one rank of one job attempt (a TaskAssignment) from start to end: builds the rank's
// stages, bootstraps the data plane through the rendezvous store, agrees shapes with the other
// ranks, runs steps with the schedule's action list, reports every step, writes checkpoints,
// and reports how the task ended.
//
// The step gate. Steps are counted in the job's timeline ("global steps", counting the resumed
// checkpoint's resume.step). At every step boundary, with `done` global steps done, the task:
//   1. runs the pending client step (ControlTask's ClientStep) for `done`, if there is one;
//   2. else, when done < step_limit, runs a data step (the spec's batch for step `done`);
//   3. else, with finish_at_limit, ends: every rank meets at a final barrier, then SUCCEEDED;
//   4. else holds: keeps its stages, optimizer state and data plane and waits (no busy loop)
//      until ControlTask moves it on or Stop is called; a hold longer than
//      TaskAssignment.hold_timeout (24 h when unset) fails the task.
// step_limit and finish_at_limit start as the assignment's and ControlTask replaces them;
// step_limit == resume.step starts the task held (after its set-up and shape agreement).
// A checkpoint is written after a training step whose new global step count is a multiple of
// training.checkpoint.every_steps or one of the requested checkpoint steps
// (TaskAssignment.checkpoint_steps, ControlTask.checkpoint_steps and RequestCheckpoint calls).
//
// Client steps. A training client step runs like a data step on the client's batch (stage 0's
// rank splits the inputs, the last stage's rank the targets) and counts in the timeline; a
// forward-only one runs the F, SEND_F and RECV_F actions of the rank's list (ForwardActions) on
// a forward-only executor, does not count, and the last stage's rank reports the outputs. Every
// rank agrees shapes again before a client step and before the first data step after one.
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
#include "worker/runtime/message_tags.h"
#include "worker/transport/rendezvous_store.h"
#include "worker/transport/transport.h"

namespace stagecoach::model {
class StageModel;
}  // namespace stagecoach::model

namespace stagecoach::runtime {

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
  // orders transfers per link; worker/runtime/message_tags.h).
  std::vector<int> stage_to_rank;
  bool forward_only = false;
  // Producer -> consumer stage pairs that are not adjacent: skip connections of a graph-split
  // model, which have links of their own.
  std::vector<SkipPair> skips;
};

// Creates the data-plane transport for a task, rendezvousing through `store`.
using TransportFactory = std::function<absl::StatusOr<std::unique_ptr<transport::Transport>>(
    const TransportRequest& request, transport::RendezvousStore* store)>;

// Turns a file reference of a spec (model.torchscript, data.path) into a path on this worker:
// "artifact:<id>" is fetched from the coordinator's artifact store (and cached); anything else
// is a path on the worker's filesystem and is returned as is. Errors name the reference.
using FileResolver = std::function<absl::StatusOr<std::string>(const std::string& ref)>;

struct TaskRunnerDeps {
  std::string worker_id;
  TaskReporter* reporter = nullptr;             // required
  transport::RendezvousStore* store = nullptr;  // required
  TransportFactory make_transport;              // required
  // The worker's device as runtime::CheckDevice canonicalised it: "cpu" or "cuda:N". Jobs with
  // placement.device cuda run on it; cpu jobs run on the CPU whatever it is.
  std::string device = "cpu";
  // Resolves model.torchscript and data.path; when unset, references are used as paths.
  FileResolver resolve_file;
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
  // implements): replaces the step limit and finish_at_limit (always: a request that only adds
  // checkpoint steps repeats the current ones), adds checkpoint steps (steps the task has
  // already passed are ignored) and hands over at most one client step. Returns the
  // global steps done when the request was taken. FAILED_PRECONDITION (naming job, rank and
  // steps) for another job or attempt, a task that has ended or is finishing, a step_limit
  // below the steps done (or below done + 1 while a step runs), a client step when the task
  // does not hold at exactly client_step.global_step or one is already pending, and a training
  // client step on a forward-only task; INVALID_ARGUMENT naming the field for a malformed
  // client step. Thread-safe; does not wait for the step.
  absl::StatusOr<v1::ControlTaskResponse> ControlTask(const v1::ControlTaskRequest& request);

  const v1::TaskAssignment& task() const { return task_; }
  int64_t steps_done() const { return steps_done_.load(); }

 private:
  absl::Status RunSteps();
  // Waits at the gate until ControlTask changes something or Stop is called, at most the
  // hold timeout; DEADLINE_EXCEEDED (which fails the task) when that expires.
  absl::Status HoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const v1::TaskAssignment task_;
  TaskRunnerDeps deps_;
  // Infer jobs, on the rank owning the last stage: the merged outputs, for ReportTaskEnd.
  // Written by RunSteps and read by Run, on Run's thread.
  std::optional<v1::TensorData> inference_outputs_;
  std::atomic<int64_t> steps_done_{0};

  // A client step handed over by ControlTask, its tensors decoded (defined in the .cc file).
  struct ClientBatch;

  absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  // Steps of the job's timeline done (a resumed checkpoint's step plus this task's counted
  // steps).
  int64_t global_steps_done_ ABSL_GUARDED_BY(mu_) = 0;
  // A step is running (between the gate's decision and its report).
  bool executing_ ABSL_GUARDED_BY(mu_) = false;
  // The gate decided to end the task (finish_at_limit reached), or it has ended.
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  // The gate's parameters (see the file comment).
  int64_t step_limit_ ABSL_GUARDED_BY(mu_) = 0;
  bool finish_at_limit_ ABSL_GUARDED_BY(mu_) = false;
  // Global steps after which to checkpoint (besides every_steps).
  std::set<int64_t> checkpoint_steps_ ABSL_GUARDED_BY(mu_);
  // A checkpoint asked for at exactly the steps done, while holding: written by the gate before
  // it holds again (checkpoint_only report).
  bool checkpoint_at_hold_ ABSL_GUARDED_BY(mu_) = false;
  // The client step to run at the next boundary, if any.
  std::unique_ptr<ClientBatch> pending_client_ ABSL_GUARDED_BY(mu_);
  // Bumped by every ControlTask, so that a holding task wakes up.
  int64_t control_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  // The transport in use, so that Stop can abort it; owned by RunSteps.
  transport::Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Stage 0, on the rank owning it, while RunSteps has it: ControlTask runs a client batch
  // through it (the task holds then) to refuse a batch it cannot take before any rank starts.
  model::StageModel* stage0_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The rendezvous store wrapper in use, so that Stop can cancel its waits.
  class CancellableStore;
  std::unique_ptr<CancellableStore> store_;
};

}  // namespace stagecoach::runtime
