// Runs one rank of one job attempt (a TaskAssignment) from start to end: builds the rank's
// stages, bootstraps the data plane through the rendezvous store, agrees shapes with the other
// ranks, runs the training steps with the schedule's action list, reports every step, writes
// stage parameters when the spec asks, and reports how the task ended.
//
// Forward-only tasks (TaskAssignment.forward_only) run F actions only: no targets, losses,
// optimizer steps or checkpoints. An Infer job's task (TaskAssignment.inference) runs one such
// step on the client's batch instead of the spec's data, and the rank owning the last stage
// returns the merged outputs in its ReportTaskEnd.
//
// This header keeps LibTorch out of its includes so the gRPC service can include it cheaply.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stagecoach/v1/coordinator.pb.h"
#include "stagecoach/v1/types.pb.h"
#include "worker/runtime/message_tags.h"
#include "worker/transport/rendezvous_store.h"
#include "worker/transport/transport.h"

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
  // reaches that step; FAILED_PRECONDITION when it has already done that many steps. A later
  // request replaces an earlier one. Thread-safe.
  absl::Status RequestCheckpoint(int64_t global_step);

  const v1::TaskAssignment& task() const { return task_; }
  int64_t steps_done() const { return steps_done_.load(); }

 private:
  absl::Status RunSteps();

  const v1::TaskAssignment task_;
  TaskRunnerDeps deps_;
  // Infer jobs, on the rank owning the last stage: the merged outputs, for ReportTaskEnd.
  // Written by RunSteps and read by Run, on Run's thread.
  std::optional<v1::TensorData> inference_outputs_;
  std::atomic<int64_t> steps_done_{0};

  absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  // Steps of the job's timeline done (a resumed checkpoint's step plus this task's); -1 before
  // the task knows where it starts.
  int64_t global_steps_done_ ABSL_GUARDED_BY(mu_) = -1;
  // RequestCheckpoint's step; -1 for none.
  int64_t requested_checkpoint_ ABSL_GUARDED_BY(mu_) = -1;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  // The transport in use, so that Stop can abort it; owned by RunSteps.
  transport::Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The rendezvous store wrapper in use, so that Stop can cancel its waits.
  class CancellableStore;
  std::unique_ptr<CancellableStore> store_;
};

}  // namespace stagecoach::runtime
