#include "worker/service/task_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "worker/runtime/device/compute_slice.h"
#include "worker/runtime/device/compute_threads.h"
#include "worker/runtime/device/cpu_pinning.h"

namespace stagecoach::worker {

absl::Status ValidateAssignment(const v1::TaskAssignment& task) {
  auto bad = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("assignment.", field, ": ", why));
  };
  if (task.job_id().empty()) return bad("job_id", "required");
  if (task.attempt() < 1) return bad("attempt", absl::StrCat("must be >= 1, got ", task.attempt()));
  if (task.world_size() < 1) {
    return bad("world_size", absl::StrCat("must be >= 1, got ", task.world_size()));
  }
  if (task.rank() < 0 || task.rank() >= task.world_size()) {
    return bad("rank",
               absl::StrCat("must be in 0..", task.world_size() - 1, ", got ", task.rank()));
  }
  const int replicas = std::max(1, task.replicas());
  if (task.replicas() < 0 || task.replica() < 0 || task.replica() >= replicas) {
    return bad("replica", absl::StrCat("must be in 0..", replicas - 1, " (replicas ",
                                       task.replicas(), "), got ", task.replica()));
  }
  if (task.num_stages() < 1) {
    return bad("num_stages", absl::StrCat("must be >= 1, got ", task.num_stages()));
  }
  if (task.stage_to_rank_size() != task.num_stages()) {
    return bad("stage_to_rank", absl::StrCat("must have num_stages (", task.num_stages(),
                                             ") entries, got ", task.stage_to_rank_size()));
  }
  for (int s = 0; s < task.stage_to_rank_size(); ++s) {
    if (task.stage_to_rank(s) < 0 || task.stage_to_rank(s) >= task.world_size()) {
      return bad(absl::StrCat("stage_to_rank[", s, "]"),
                 absl::StrCat("must be a rank in 0..", task.world_size() - 1));
    }
  }
  if (task.stages_size() == 0) return bad("stages", "required");
  if (task.actions_size() == 0) return bad("actions", "required");
  if (task.spec_yaml().empty()) return bad("spec_yaml", "required");
  if (task.comm_timeout().seconds() <= 0 && task.comm_timeout().nanos() <= 0) {
    return bad("comm_timeout", "must be positive");
  }
  return absl::OkStatus();
}

TaskManager::~TaskManager() { StopAll("worker shutting down", absl::Seconds(30)); }

namespace {

// Joins `thread` if it runs.
void JoinIfJoinable(std::thread& thread) {
  if (thread.joinable()) thread.join();
}

struct TaskCpus {
  int threads = 1;
  std::vector<int> pinned;  // empty: not pinned
};

// The task's compute threads (worker/runtime/device/compute_threads.h) and the CPUs they are pinned
// to (worker/runtime/device/cpu_pinning.h), logged with why.
TaskCpus ChooseTaskCpus(const TaskManagerDeps& deps, const v1::TaskAssignment& task) {
  const runtime::CpuAllowance allowance = runtime::ReadCpuAllowance();
  TaskCpus cpus;
  cpus.threads =
      runtime::ChooseComputeThreads(deps.compute_threads, allowance, task.ranks_on_host());
  runtime::PinningInputs pinning;
  pinning.enabled = deps.pin_threads;
  pinning.affinity = runtime::AffinityMask();
  pinning.quota = allowance.quota_cpus.has_value();
  pinning.threads = cpus.threads;
  pinning.ranks_on_host = task.ranks_on_host();
  pinning.index_on_host = task.index_on_host();
  runtime::PinningChoice choice = runtime::ChooseComputeCpus(pinning);
  cpus.pinned = std::move(choice.cpus);
  spdlog::info(
      "{} rank {}: {}, {}", task.job_id(), task.rank(),
      runtime::DescribeComputeThreads(deps.compute_threads, allowance, task.ranks_on_host()),
      choice.why);
  return cpus;
}

}  // namespace

std::thread TaskManager::ReapLocked() {
  if (!running_ && thread_.joinable()) return std::move(thread_);
  return std::thread();
}

absl::Status TaskManager::Start(const v1::TaskAssignment& task) {
  if (absl::Status valid = ValidateAssignment(task); !valid.ok()) return valid;
  if (std::find(deps_.transports.begin(), deps_.transports.end(), task.transport()) ==
      deps_.transports.end()) {
    return absl::InvalidArgumentError(absl::StrCat("transport: this worker offers ",
                                                   absl::StrJoin(deps_.transports, ", "), ", not '",
                                                   task.transport(), "'"));
  }
  std::thread finished;  // a previous task's thread, joined after mu_ is released
  absl::Status started = Launch(task, finished);
  JoinIfJoinable(finished);
  return started;
}

absl::Status TaskManager::Launch(const v1::TaskAssignment& task, std::thread& finished) {
  absl::MutexLock lock(&mu_);
  finished = ReapLocked();
  if (running_) {
    const v1::TaskAssignment& current = runner_->task();
    if (current.job_id() == task.job_id() && current.attempt() == task.attempt() &&
        current.rank() == task.rank()) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(
        absl::StrCat("worker is busy with ", current.job_id(), " rank ", current.rank()));
  }
  runtime::TaskRunnerDeps deps;
  deps.worker_id = deps_.worker_id();
  deps.reporter = deps_.reporter;
  deps.store = deps_.store;
  deps.make_transport = deps_.make_transport;
  deps.make_collectives = deps_.make_collectives;
  deps.device = deps_.device;
  deps.resolve_file = deps_.resolve_file;
  deps.memory_counter = deps_.memory_counter;
  deps.settle_step = deps_.settle_step;
  deps.snapshot_store = deps_.snapshot_store;
  deps.report_snapshot = deps_.report_snapshot;
  deps.debug_slow_factor = deps_.debug_slow_factor;
  runner_ = std::make_unique<runtime::TaskRunner>(task, std::move(deps));
  running_ = true;
  runtime::TaskRunner* runner = runner_.get();
  spdlog::info("starting {} attempt {} rank {}/{} replica {}/{}", task.job_id(), task.attempt(),
               task.rank(), task.world_size(), task.replica(), std::max(1, task.replicas()));
  const TaskCpus cpus = ChooseTaskCpus(deps_, task);
  thread_ = std::thread([this, runner, cpus, job = task.job_id(), rank = task.rank()] {
    if (!cpus.pinned.empty()) {
      absl::Status pinned = runtime::PinCallingThread(cpus.pinned);
      if (!pinned.ok()) spdlog::warn("{} rank {}: {}", job, rank, pinned.message());
    }
    runtime::UseComputeThreads(cpus.threads);
    const runtime::TimeSliceResult slice = runtime::RequestTimeSlice(runtime::kComputeTimeSlice);
    spdlog::info("{} rank {}: {}", job, rank, slice.why);
    const v1::ReportTaskEndRequest end = runner->Run();
    {
      absl::MutexLock lock(&mu_);
      running_ = false;  // free for a next task before the coordinator hears this one ended
    }
    absl::Status reported = deps_.reporter->ReportTaskEnd(end);
    if (!reported.ok()) {
      spdlog::warn("reporting the end of {}: {}", end.job_id(), reported.message());
    }
  });
  return absl::OkStatus();
}

absl::Status TaskManager::Stop(const std::string& job_id, const std::string& reason,
                               absl::Duration timeout) {
  std::thread finished;  // joined after mu_ is released (ReapLocked)
  std::shared_ptr<runtime::TaskRunner> runner;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || runner_->task().job_id() != job_id) {
      finished = ReapLocked();
    } else {
      runner = runner_;
    }
  }
  if (runner != nullptr) {
    spdlog::info("stopping {}: {}", job_id, reason);
    // Without mu_: aborting the data plane may wait on the transport's threads, and heartbeats
    // (Status) must not wait behind it.
    runner->Stop(reason);
    absl::MutexLock lock(&mu_);
    auto ended = [this, &runner]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !running_ || runner_ != runner; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("task of ", job_id, " did not stop within ", absl::FormatDuration(timeout)));
    }
    finished = ReapLocked();
  }
  JoinIfJoinable(finished);
  return absl::OkStatus();
}

absl::Status TaskManager::RequestCheckpoint(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  if (!running_ || runner_->task().job_id() != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", deps_.worker_id(), " runs no task of ", job_id));
  }
  return runner_->RequestCheckpoint(step);
}

absl::StatusOr<std::shared_ptr<runtime::TaskRunner>> TaskManager::RunnerOf(
    const std::string& job_id, int attempt) {
  absl::MutexLock lock(&mu_);
  if (!running_ || runner_->task().job_id() != job_id || runner_->task().attempt() != attempt) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", deps_.worker_id(), " runs no task of ", job_id, " attempt ",
                     attempt,
                     running_ ? absl::StrCat(" (it runs ", runner_->task().job_id(), " attempt ",
                                             runner_->task().attempt(), ")")
                              : std::string()));
  }
  return runner_;
}

absl::StatusOr<v1::DecodeResponse> TaskManager::Decode(const v1::DecodeRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::TaskRunner> runner,
                   RunnerOf(request.job_id(), request.attempt()));
  return runner->Decode(request);
}

absl::StatusOr<v1::ControlTaskResponse> TaskManager::Control(
    const v1::ControlTaskRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<runtime::TaskRunner> runner,
                   RunnerOf(request.job_id(), request.attempt()));
  // TaskRunner::ControlTask never waits for a step, but a client step's check on stage 0 runs
  // the batch through the stage: without mu_, so that Status (heartbeats) and Stop go on. A
  // task that ends meanwhile refuses the request.
  return runner->ControlTask(request);
}

void TaskManager::StopAll(const std::string& reason, absl::Duration timeout) {
  std::string job_id;
  {
    absl::MutexLock lock(&mu_);
    if (running_) job_id = runner_->task().job_id();
  }
  if (!job_id.empty()) {
    absl::Status stopped = Stop(job_id, reason, timeout);
    if (!stopped.ok()) spdlog::error("{}", stopped.message());
  }
  std::thread finished;
  {
    absl::MutexLock lock(&mu_);
    finished = ReapLocked();
  }
  JoinIfJoinable(finished);
}

v1::GetWorkerStatusResponse TaskManager::Status() {
  v1::GetWorkerStatusResponse out;
  out.set_worker_id(deps_.worker_id());
  absl::MutexLock lock(&mu_);
  if (running_) {
    out.set_job_id(runner_->task().job_id());
    out.set_rank(runner_->task().rank());
    out.set_steps_done(runner_->steps_done());
  } else {
    out.set_rank(-1);
  }
  return out;
}

std::optional<v1::RankProgress> TaskManager::Progress() {
  absl::MutexLock lock(&mu_);
  if (!running_) return std::nullopt;
  return runner_->Progress();
}

}  // namespace stagecoach::worker
