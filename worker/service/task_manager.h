// Holds the worker's one running task: starts it on its own thread, stops it on request, and
// says what is running. A worker runs at most one task at a time.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagecoach/v1/worker.pb.h"
#include "worker/runtime/task/task_runner.h"

namespace stagecoach::worker {

struct TaskManagerDeps {
  runtime::TaskReporter* reporter = nullptr;    // required
  transport::RendezvousStore* store = nullptr;  // required
  runtime::TransportFactory make_transport;     // required
  // Data-parallel groups of jobs with placement.replicas > 1 (TaskRunnerDeps::make_collectives).
  runtime::CollectivesFactory make_collectives;
  std::function<std::string()> worker_id;  // required: the id of the registration
  // Transports make_transport offers (TaskAssignment.transport must be one).
  std::vector<std::string> transports = {"gloo"};
  // The worker's device, "cpu" or "cuda:N" (TaskRunnerDeps::device).
  std::string device = "cpu";
  // Resolves model.torchscript and data.path references, e.g. "artifact:<id>" through the
  // worker's ArtifactCache (TaskRunnerDeps::resolve_file); unset: references are paths.
  runtime::FileResolver resolve_file;
  // TaskRunnerDeps::memory_counter.
  runtime::CountingCpuAllocator* memory_counter = nullptr;
  // TaskRunnerDeps::settle_step: CoordinatorService.SettleStep.
  runtime::StepSettler settle_step;
  // TaskRunnerDeps::snapshot_store and report_snapshot: the worker's in-memory snapshots and
  // CoordinatorService.ReportSnapshot.
  runtime::SnapshotStore* snapshot_store = nullptr;
  runtime::SnapshotReporter report_snapshot;
  // The worker's --threads (0: by the policy of worker/runtime/device/compute_threads.h, with the
  // task's ranks_on_host), set on the task's thread before it runs.
  int compute_threads = 0;
  // Pin the task's compute threads where worker/runtime/device/cpu_pinning.h's policy allows (the
  // worker's default; --no-pin-threads clears it).
  bool pin_threads = true;
  // TaskRunnerDeps::debug_slow_factor (--debug-slow-actions).
  double debug_slow_factor = 1.0;
};

// Thread-safe.
class TaskManager {
 public:
  explicit TaskManager(TaskManagerDeps deps) : deps_(std::move(deps)) {}
  // Stops a running task and waits for it.
  ~TaskManager();

  // Starts `task` in the background. Starting the task that already runs (same job and
  // attempt) is OK (a retried call); FAILED_PRECONDITION while another task runs;
  // INVALID_ARGUMENT naming the field for an assignment that cannot be run.
  absl::Status Start(const v1::TaskAssignment& task);

  // Stops the task of `job_id` and waits up to `timeout` for it to end. OK when no such task
  // runs; DEADLINE_EXCEEDED when it did not stop in time (it keeps stopping in the background).
  absl::Status Stop(const std::string& job_id, const std::string& reason, absl::Duration timeout);

  // Asks the running task of `job_id` to write a checkpoint after the step that brings the
  // job's timeline to `step` steps (TaskRunner::RequestCheckpoint; requests add up).
  // FAILED_PRECONDITION when no task of that job runs here or it has already passed that step.
  absl::Status RequestCheckpoint(const std::string& job_id, int64_t step);

  // Steers the running task of request.job_id and request.attempt at step boundaries
  // (TaskRunner::ControlTask, WorkerService.ControlTask). FAILED_PRECONDITION naming the job
  // when no task of that job and attempt runs here; otherwise the task's answer.
  absl::StatusOr<v1::ControlTaskResponse> Control(const v1::ControlTaskRequest& request);

  // A generation session's decoding step on the running task of request.job_id
  // (TaskRunner::Decode, WorkerService.Decode). FAILED_PRECONDITION naming the job when the
  // worker runs no task of that job and attempt. Runs without the manager's lock.
  absl::StatusOr<v1::DecodeResponse> Decode(const v1::DecodeRequest& request);

  // Stops whatever runs (shutdown, or the coordinator forgot this worker).
  void StopAll(const std::string& reason, absl::Duration timeout);

  v1::GetWorkerStatusResponse Status();

  // The running task's progress beacon (TaskRunner::Progress); unset when no task runs.
  std::optional<v1::RankProgress> Progress();

 private:
  // The running task of `job_id` and `attempt`; FAILED_PRECONDITION naming what runs instead.
  absl::StatusOr<std::shared_ptr<runtime::TaskRunner>> RunnerOf(const std::string& job_id,
                                                                int attempt);
  // The thread of a task that has ended, if any, for the caller to join once it has released
  // mu_: the thread may still be reporting the task's end to the coordinator (a network call),
  // and Status, which heartbeats use, must never wait for that.
  std::thread ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Start's part under mu_ (it takes it); hands a previous task's thread to join in `finished`.
  absl::Status Launch(const v1::TaskAssignment& task, std::thread& finished)
      ABSL_LOCKS_EXCLUDED(mu_);

  const TaskManagerDeps deps_;
  absl::Mutex mu_;
  // Shared with a Control or Stop call in flight, which runs without mu_ (a client step's check
  // on stage 0 takes a while, aborting a data plane may too, and Status must not wait for them).
  std::shared_ptr<runtime::TaskRunner> runner_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // runner_'s thread has not finished Run
};

// Checks the fields of an assignment a worker needs before it starts the task.
absl::Status ValidateAssignment(const v1::TaskAssignment& task);

}  // namespace stagecoach::worker
