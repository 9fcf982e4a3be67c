// Step control: pause, resume, run N more steps, a step on a client's batch (StepJob),
// checkpoint now, and the coordinator's own steering at step boundaries (hold where a pause
// asked, tell the ranks to finish at the job's last step). Ranks are steered through
// WorkerService.ControlTask; the semantics are those of the RPCs in coordinator.proto and
// docs/control.md.
//
// Serialised per job, not globally: each call takes its job's control lock (Job::control_mu)
// and holds it across its calls to workers and, for StepJob, across the wait for the step, but
// never holds the job table's lock while a worker is called or a step awaited. So a job whose
// worker is frozen delays only control of that job; every other job's control, status and
// reports go on. Lock order: a job's control lock, then the job table's lock.
//
// Methods named *Locked are called with the job table's lock held (and no control lock).
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/util/clock.h"
#include "common/util/executor.h"
#include "coordinator/jobs/job_table.h"
#include "coordinator/lifecycle/job_lifecycle.h"
#include "coordinator/workers/worker_client.h"
#include "stagecoach/v1/coordinator.pb.h"

namespace stagecoach::coordinator {

struct StepControlOptions {
  // Bound on each ControlTask / RequestCheckpoint call.
  absl::Duration worker_rpc_timeout = absl::Seconds(10);
  // How often a waiting StepJob checks whether its caller went away.
  absl::Duration poll_interval = absl::Milliseconds(250);
};

struct StepControlDeps {
  JobTable* table = nullptr;
  WorkerClient* workers = nullptr;
  Executor* executor = nullptr;
  Clock* clock = nullptr;
  JobLifecycle* lifecycle = nullptr;
};

class StepControl {
 public:
  StepControl(StepControlOptions options, StepControlDeps deps);
  ~StepControl();

  // Turns the closures it queued that have not started into no-ops and waits for running ones
  // (bounded by their calls' timeouts). The owner calls it before destroying what they use.
  void Close() { scope_.Close(); }

  // CoordinatorService.PauseJob: the ranks hold at the earliest step boundary none has passed
  // (a later one when a rank already passed it, a few times). FAILED_PRECONDITION unless
  // RUNNING (PAUSED answers where it holds); ABORTED when no boundary was left or the job
  // changed meanwhile; a worker's error (naming the rank) fails or restarts the job. A pause
  // whose caller went away (`caller_gone`, when set: its deadline passed or it cancelled) before
  // it took effect is not applied later: CANCELLED, and ranks that had taken its step limit are
  // told to run on (a client told the pause failed never finds the job paused by it).
  absl::StatusOr<v1::PauseJobResponse> Pause(const std::string& job_id,
                                             const std::function<bool()>& caller_gone = nullptr);
  // CoordinatorService.ResumeJob: a PAUSED job runs to its end.
  absl::StatusOr<v1::Job> Resume(const std::string& job_id);
  // CoordinatorService.RunSteps: `steps` (>= 1) more steps, then hold; extends the job's end
  // when they go past it.
  absl::StatusOr<v1::RunStepsResponse> RunSteps(const std::string& job_id, int64_t steps);
  // CoordinatorService.StepJob: one step on the client's batch of a PAUSED job (training, or
  // forward-only), waiting up to `timeout` for it; `caller_gone` (optional) is checked
  // meanwhile. DEADLINE_EXCEEDED / CANCELLED when the wait ends first (the job keeps running
  // the step); INVALID_ARGUMENT naming the field for a batch the job cannot take (the job stays
  // PAUSED); ABORTED when the job failed or restarted during the step.
  absl::StatusOr<v1::StepJobResponse> StepJob(const v1::StepJobRequest& request,
                                              absl::Duration timeout,
                                              const std::function<bool()>& caller_gone);
  // CoordinatorService.CheckpointJob (RUNNING or PAUSED jobs); see JobManager::CheckpointJob.
  absl::StatusOr<v1::CheckpointJobResponse> Checkpoint(const std::string& job_id);

  // After a step completed or the job started: PAUSED once every rank holds at the hold step,
  // and the ranks told to finish once the job has done its last step.
  void AfterProgressLocked(Job& job);

  // Wakes StepJob waits so they end (UNAVAILABLE) when the coordinator shuts down.
  void ShutdownLocked();

 private:
  // The control lock of `job_id`; NOT_FOUND for an unknown job.
  absl::StatusOr<std::shared_ptr<absl::Mutex>> ControlLock(const std::string& job_id);
  absl::StatusOr<v1::CheckpointJobResponse> CheckpointRunning(const std::string& job_id);
  absl::StatusOr<v1::CheckpointJobResponse> CheckpointPaused(const std::string& job_id);
  void MaybePauseLocked(Job& job);
  void MaybeFinishLocked(Job& job);
  // Sends `requests[r]` to rank r's worker, each on the executor; a failed call fails (or
  // restarts) the job, naming the rank.
  void SendControlLocked(Job& job, std::vector<v1::ControlTaskRequest> requests);
  // Sends `requests[i]` to `ranks[i]` (rank, worker address) now, in order, without locks; the
  // first error names the rank, which goes to *failed_rank.
  absl::Status CallControl(const std::vector<std::pair<int, std::string>>& ranks,
                           const std::vector<v1::ControlTaskRequest>& requests, int* failed_rank);
  // StepJob's parts (client_step.cc).
  struct ClientStepCall;
  absl::StatusOr<ClientStepCall> BeginClientStep(const v1::StepJobRequest& request);
  // After `refused_rank` refused the client step, tells the ranks of `ranks` called before it
  // (they took it) to hold at its step, now and in order (CallControl); no locks held.
  absl::Status WithdrawClientStep(const ClientStepCall& call,
                                  const std::vector<std::pair<int, std::string>>& ranks,
                                  int refused_rank, int* failed_rank);
  absl::StatusOr<v1::StepJobResponse> AwaitClientStep(const ClientStepCall& call,
                                                      absl::Duration timeout,
                                                      const std::function<bool()>& caller_gone);

  const StepControlOptions options_;
  const StepControlDeps deps_;
  bool stopping_ = false;  // guarded by the job table's lock
  TaskScope scope_;
};

// The ControlTask request that sets the step limit of `job`'s current attempt.
v1::ControlTaskRequest ControlRequest(const Job& job, int64_t step_limit);

// The tasks of a job's current attempt: (task index in Job::ranks, worker address); the index
// is the rank with one replica.
std::vector<std::pair<int, std::string>> RankAddresses(const Job& job);

}  // namespace stagecoach::coordinator
