#include "coordinator/job_manager.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "coordinator/jobs/plan_memory.h"
#include "coordinator/planning/schedule_view.h"

namespace stagecoach::coordinator {
namespace {

// A fresh secret for a worker's registration (RegisterWorkerResponse.session_token).
std::string NewSessionToken() {
  static absl::Mutex mu(absl::kConstInit);
  static std::random_device* device = new std::random_device();
  absl::MutexLock lock(&mu);
  std::string out;
  for (int i = 0; i < 8; ++i) out += absl::StrFormat("%08x", (*device)());
  return out;
}

// How often a waiting Infer call checks whether its caller went away or its deadline passed.
constexpr absl::Duration kInferPoll = absl::Milliseconds(250);

JobTableOptions TableOptions(const JobManagerOptions& options) {
  JobTableOptions out;
  out.retain_finished_jobs = options.retain_finished_jobs;
  out.retain_finished_for = options.retain_finished_for;
  out.max_job_events = options.max_job_events;
  return out;
}

}  // namespace

JobManager::JobManager(JobManagerOptions options, JobManagerDeps deps)
    : options_(options),
      deps_(deps),
      registry_(options.lease),
      writer_(deps.store != nullptr ? std::make_unique<JobWriter>(deps.store, deps.executor)
                                    : nullptr),
      table_(TableOptions(options), writer_.get()),
      admission_(AdmissionOptions{options.inspect_timeout, options.profile_iterations,
                                  options.limits, options.plan_timeout, options.plan_costs},
                 &registry_, deps.workers),
      placement_(TaskSettings{options.comm_timeout, options.hold_timeout}, &registry_),
      aggregator_(deps.metrics),
      lifecycle_(LifecycleOptions{options.worker_rpc_timeout, options.probe_timeout},
                 LifecycleDeps{&table_, &registry_, deps.workers, deps.kv, deps.executor,
                               deps.clock, deps.metrics, this}),
      control_(StepControlOptions{options.worker_rpc_timeout},
               StepControlDeps{&table_, deps.workers, deps.executor, deps.clock, &lifecycle_}),
      settlement_(StepSettlementDeps{&table_, &lifecycle_, deps.clock}) {}

JobManager::~JobManager() {
  {
    absl::MutexLock lock(&table_.mu());
    stopping_ = true;
    control_.ShutdownLocked();
  }
  if (ticker_.joinable()) ticker_.join();
  // Queued work stops before any component goes: a running lifecycle closure may still call
  // step control, and either may call back into this manager.
  scope_.Close();
  lifecycle_.Close();
  control_.Close();
}

void JobManager::Start() {
  ticker_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&table_.mu());
        auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu()) { return stopping_; };
        if (table_.mu().AwaitWithTimeout(absl::Condition(&stopping), options_.tick_interval)) {
          return;
        }
      }
      Tick();
    }
  });
}

void JobManager::Tick() {
  const absl::Time now = deps_.clock->Now();
  const std::vector<std::string> lost = registry_.ExpireLeases(now);
  absl::MutexLock lock(&table_.mu());
  for (const std::string& id : lost) {
    spdlog::warn("worker {} lost: lease expired", id);
    for (Job* job : table_.AllLocked()) job->ForgetSpare(id);
  }
  lifecycle_.WorkersLostLocked(lost);
  for (const std::string& id : table_.PruneLocked(now)) {
    spdlog::info("{} dropped from the job table (retention)", id);
  }
  ScheduleLocked();
  DiagnoseJobsLocked(now);
  UpdateStateMetricsLocked();
}

void JobManager::ScheduleLocked() {
  QueueResizesLocked();
  // A running job's missing replica first: it is part of what the job already holds.
  for (HealOrder& order : PlanHealsLocked(
           table_, registry_, TaskSettings{options_.comm_timeout, options_.hold_timeout})) {
    lifecycle_.StartHealing(std::move(order));
  }
  for (StartOrder& order : placement_.PlaceLocked(table_, deps_.clock->Now())) {
    lifecycle_.StartAttempt(std::move(order));
  }
}

void JobManager::AttemptStartedLocked(Job& job) { control_.AfterProgressLocked(job); }

void JobManager::ReplicaLostLocked(Job& job) {
  if (aggregator_.CompleteWaitingStepsLocked(job, deps_.clock->Now()) > 0) {
    control_.AfterProgressLocked(job);
  }
  ScheduleLocked();
}

void JobManager::UpdateStateMetricsLocked() {
  if (deps_.metrics == nullptr) return;
  std::map<v1::JobState, int> jobs;
  for (const Job* job : table_.AllLocked()) ++jobs[job->state];
  deps_.metrics->SetJobCounts(jobs);
  // Counted in place: copying every record ten times a second held the registry's lock, which
  // every heartbeat takes, for a copy of the whole fleet.
  deps_.metrics->SetWorkerCounts(registry_.Counts());
}

// --- Jobs ---

Job& JobManager::AddJobLocked(AdmittedJob admitted) {
  const absl::Time now = deps_.clock->Now();
  Job& job = table_.CreateLocked();
  job.spec = std::move(admitted.spec);
  job.spec_yaml = std::move(admitted.spec_yaml);
  job.plan = std::move(admitted.plan);
  job.plan_choice = std::move(admitted.plan_choice);
  job.created = now;
  ApplyResume(admitted.resume, job);
  job.attempt_base = job.base_step;
  // Admission parsed the spec, inspected the model and split it before the job was added (a
  // spec that fails there is refused and nothing is queued), so PLANNING is already behind it.
  for (auto [state, why] :
       {std::pair{v1::JOB_STATE_PLANNING, std::string("submitted")},
        std::pair{v1::JOB_STATE_PENDING,
                  absl::StrCat("planned: ", job.plan.num_stages, " stages on ", job.plan.num_ranks,
                               " workers, ", job.plan.schedule_name,
                               job.plan_choice.has_value()
                                   ? absl::StrCat(" (chosen by the plan search of ",
                                                  job.plan_choice->candidates(), " plans)")
                                   : std::string())}}) {
    absl::Status moved = job.TransitionTo(state, why, now);
    if (!moved.ok()) spdlog::error("{}: {}", job.id, moved.message());
  }
  spdlog::info("{} submitted: {} stages on {} workers, {} x {} microbatches, {} steps", job.id,
               job.plan.num_stages, job.plan.num_ranks, job.plan.schedule_name,
               job.plan.num_microbatches, job.spec.training.steps);
  return job;
}

absl::StatusOr<std::string> JobManager::SubmitJob(const std::string& spec_yaml,
                                                  const std::string& origin, bool start_paused,
                                                  const std::function<bool()>& caller_gone) {
  ASSIGN_OR_RETURN(AdmittedJob admitted, admission_.AdmitTraining(spec_yaml, origin, caller_gone));
  absl::MutexLock lock(&table_.mu());
  RETURN_IF_ERROR(MakeRoomForPlan(PlanMemoryBytes(admitted.plan), table_.AllLocked(),
                                  options_.max_plan_memory_bytes));
  Job& job = AddJobLocked(std::move(admitted));
  job.finish_step = job.base_step + job.spec.training.steps;
  if (start_paused) job.hold_step = job.base_step;
  const std::string id = job.id;
  table_.PersistLocked(job);
  ScheduleLocked();
  return id;
}

absl::StatusOr<SearchedPlans> JobManager::SearchPlans(const std::string& spec_yaml,
                                                      const std::string& origin,
                                                      int64_t memory_limit_bytes,
                                                      const std::function<bool()>& caller_gone) {
  return admission_.SearchPlans(spec_yaml, origin, memory_limit_bytes, caller_gone);
}

absl::StatusOr<v1::DescribeModelResponse> JobManager::DescribeModel(const std::string& torchscript,
                                                                    const std::string& device) {
  return admission_.DescribeModel(torchscript, device);
}

absl::StatusOr<InferenceResult> JobManager::Infer(const std::string& spec_yaml,
                                                  const std::string& origin, v1::TensorData inputs,
                                                  absl::Duration timeout,
                                                  const std::function<bool()>& caller_gone) {
  ASSIGN_OR_RETURN(AdmittedJob admitted,
                   admission_.AdmitInference(spec_yaml, origin, inputs, caller_gone));
  std::shared_ptr<Job> shared;
  absl::Time deadline;
  {
    absl::MutexLock lock(&table_.mu());
    RETURN_IF_ERROR(MakeRoomForPlan(PlanMemoryBytes(admitted.plan), table_.AllLocked(),
                                    options_.max_plan_memory_bytes));
    deadline = deps_.clock->Now() + timeout;  // from when the job is queued
    Job& job = AddJobLocked(std::move(admitted));
    job.finish_step = job.base_step + 1;
    job.finishing = true;  // its tasks end on their own after their one step
    job.inference = true;
    job.inference_inputs = std::move(inputs);
    shared = table_.ShareLocked(job.id);
    ScheduleLocked();
  }
  return AwaitInference(std::move(shared), deadline, timeout, caller_gone);
}

absl::StatusOr<InferenceResult> JobManager::AwaitInference(
    std::shared_ptr<Job> shared, absl::Time deadline, absl::Duration timeout,
    const std::function<bool()>& caller_gone) {
  absl::Mutex& mu = table_.mu();
  absl::MutexLock lock(&mu);
  Job& job = *shared;
  auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stopping_ || IsFinal(job.state); };
  while (!IsFinal(job.state)) {
    if (stopping_) {
      return absl::UnavailableError(absl::StrCat(job.id, ": the coordinator is shutting down"));
    }
    const absl::Duration left = deadline - deps_.clock->Now();
    std::string why;
    absl::StatusCode code = absl::StatusCode::kOk;
    if (left <= absl::ZeroDuration()) {
      why = absl::StrCat("inference did not finish within ", absl::FormatDuration(timeout));
      code = absl::StatusCode::kDeadlineExceeded;
    } else if (caller_gone && caller_gone()) {
      why = "the caller of Infer went away";
      code = absl::StatusCode::kCancelled;
    }
    if (code != absl::StatusCode::kOk) {
      lifecycle_.EndLocked(job, v1::JOB_STATE_CANCELLED, why);
      job.inference_outputs.reset();
      ScheduleLocked();
      return absl::Status(code, absl::StrCat(job.id, ": ", why, "; the job was cancelled"));
    }
    mu.AwaitWithTimeout(absl::Condition(&ended), std::min(left, kInferPoll));
  }
  // Only this call hands the outputs out; the job keeps none.
  std::optional<v1::TensorData> outputs = std::move(job.inference_outputs);
  job.inference_outputs.reset();
  switch (job.state) {
    case v1::JOB_STATE_SUCCEEDED:
      if (!outputs.has_value()) {
        return absl::InternalError(absl::StrCat(job.id, " succeeded without outputs"));
      }
      return InferenceResult{job.id, *std::move(outputs)};
    case v1::JOB_STATE_FAILED:
      return absl::AbortedError(absl::StrCat(job.id, " failed: ", job.reason));
    default:
      return absl::CancelledError(absl::StrCat(job.id, " was cancelled: ", job.reason));
  }
}

absl::StatusOr<v1::Job> JobManager::GetJob(const std::string& job_id, const HistoryWindow& window) {
  absl::MutexLock lock(&table_.mu());
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(job_id));
  v1::Job out;
  job->ToRecord(&out, window);
  job->BalanceToProto(&out);
  return out;
}

std::vector<v1::Job> JobManager::ListJobs() {
  absl::MutexLock lock(&table_.mu());
  std::vector<v1::Job> out;
  for (const Job* job : table_.AllLocked()) job->ToSummary(&out.emplace_back());
  return out;
}

absl::StatusOr<JobPage> JobManager::ListJobs(int page_size, const std::string& page_token) {
  return table_.List(page_size, page_token);
}

absl::StatusOr<v1::Job> JobManager::CancelJob(const std::string& job_id,
                                              const std::string& reason) {
  absl::MutexLock lock(&table_.mu());
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(job_id));
  if (IsFinal(job->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " has already ended (", JobStateName(job->state), ")"));
  }
  lifecycle_.EndLocked(*job, v1::JOB_STATE_CANCELLED,
                       reason.empty() ? "cancelled by client" : reason);
  ScheduleLocked();
  v1::Job out;
  job->ToProto(&out, HistoryWindow::Summary());
  return out;
}

absl::StatusOr<JobEvents> JobManager::WaitForEvents(const std::string& job_id,
                                                    int64_t from_sequence, absl::Duration timeout) {
  absl::Mutex& mu = table_.mu();
  absl::MutexLock lock(&mu);
  ASSIGN_OR_RETURN(Job * found, table_.FindOrErrorLocked(job_id));
  std::shared_ptr<Job> job = table_.ShareLocked(found->id);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return stopping_ || job->events.next_sequence() > from_sequence || IsFinal(job->state);
  };
  mu.AwaitWithTimeout(absl::Condition(&ready), timeout);
  EventLog::Slice slice = job->events.Since(from_sequence);
  JobEvents out;
  out.events = std::move(slice.events);
  out.dropped_from = slice.dropped_from;
  out.dropped_to = slice.dropped_to;
  out.ended = IsFinal(job->state);
  return out;
}

absl::StatusOr<v1::GetJobScheduleResponse> JobManager::GetJobSchedule(const std::string& job_id) {
  absl::MutexLock lock(&table_.mu());
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(job_id));
  if (job->actions_released) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " is ", JobStateName(job->state),
                     ": a job's action lists are released when it ends (and not kept on disk); "
                     "`stagectl schedule --kind ",
                     job->plan.schedule_name, " --ranks ", job->plan.num_ranks, " --microbatches ",
                     job->plan.num_microbatches, "` generates its schedule again"));
  }
  return ScheduleView(job->plan);
}

absl::StatusOr<v1::GetStepTraceResponse> JobManager::GetStepTrace(const std::string& job_id,
                                                                  int64_t global_step) {
  absl::MutexLock lock(&table_.mu());
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(job_id));
  v1::GetStepTraceResponse response;
  int64_t traced = -1;
  ASSIGN_OR_RETURN(std::string trace,
                   job->traces.Trace(global_step, job->plan.num_tasks(),
                                     absl::StrCat(job->id, " (", job->plan.schedule_name, ")"),
                                     &traced, job->id));
  response.set_global_step(traced);
  response.set_trace_json(std::move(trace));
  response.set_first_kept_step(job->traces.first_kept());
  response.set_last_kept_step(job->traces.last_kept());
  return response;
}

// --- Step control: StepControl's, serialised per job ---

absl::StatusOr<v1::CheckpointJobResponse> JobManager::CheckpointJob(const std::string& job_id) {
  return control_.Checkpoint(job_id);
}

absl::StatusOr<v1::PauseJobResponse> JobManager::PauseJob(
    const std::string& job_id, const std::function<bool()>& caller_gone) {
  return control_.Pause(job_id, caller_gone);
}

absl::StatusOr<v1::Job> JobManager::ResumeJob(const std::string& job_id) {
  return control_.Resume(job_id);
}

absl::StatusOr<v1::RunStepsResponse> JobManager::RunSteps(const std::string& job_id,
                                                          int64_t steps) {
  return control_.RunSteps(job_id, steps);
}

absl::StatusOr<v1::StepJobResponse> JobManager::StepJob(const v1::StepJobRequest& request,
                                                        absl::Duration timeout,
                                                        const std::function<bool()>& caller_gone) {
  return control_.StepJob(request, timeout, caller_gone);
}

absl::StatusOr<DecodeRoute> JobManager::DecodeRouteOf(const std::string& job_id) {
  absl::MutexLock lock(&table_.mu());
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(job_id));
  if (job->state != v1::JOB_STATE_PAUSED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", JobStateName(job->state), "; decoding needs it PAUSED"));
  }
  DecodeRoute route;
  route.job_id = job_id;
  route.attempt = job->attempt;
  // The first healthy replica (replica 0 unless it left a job whose replicas carry on).
  const std::vector<int> healthy = job->replica_health.HealthyReplicas();
  const int replica = healthy.empty() ? 0 : healthy.front();
  for (int s = 0; s < job->plan.num_stages; ++s) {
    const int rank = job->plan.stage_to_rank[s];
    for (const RankSlot& slot : job->ranks) {
      if (slot.rank == rank && slot.replica == replica) {
        route.stage_addresses.push_back(slot.worker_address);
        break;
      }
    }
    if (static_cast<int>(route.stage_addresses.size()) != s + 1) {
      return absl::InternalError(
          absl::StrCat("job ", job_id, ": no worker of replica ", replica, " runs stage ", s));
    }
  }
  return route;
}

absl::StatusOr<v1::DecodeResponse> JobManager::Decode(const std::string& address,
                                                      const v1::DecodeRequest& request,
                                                      absl::Duration timeout) {
  return deps_.workers->Decode(address, request, timeout);
}

// --- Workers ---

std::vector<v1::WorkerInfo> JobManager::ListWorkers() {
  std::vector<v1::WorkerInfo> out;
  for (const WorkerRecord& w : registry_.All()) w.ToProto(&out.emplace_back());
  return out;
}

absl::StatusOr<v1::RegisterWorkerResponse> JobManager::RegisterWorker(
    const v1::RegisterWorkerRequest& req) {
  if (req.address().empty()) {
    return absl::InvalidArgumentError("address: required (host:port of the WorkerService)");
  }
  if (req.device().empty()) return absl::InvalidArgumentError("device: required");
  ASSIGN_OR_RETURN(
      std::string id,
      registry_.Register(req.name(), req.address(), req.device(),
                         {req.transports().begin(), req.transports().end()}, deps_.clock->Now()));
  spdlog::info("worker {} registered: {} at {} ({})", id, req.name(), req.address(), req.device());
  v1::RegisterWorkerResponse out;
  out.set_session_token(NewSessionToken());
  // Set before any task can be placed on the worker, so that every call to it carries the token.
  deps_.workers->SetSessionToken(req.address(), out.session_token());
  registry_.SetSessionToken(id, out.session_token());
  out.set_worker_id(id);
  *out.mutable_heartbeat_interval() = rpc::ToProtoDuration(options_.heartbeat_interval);
  *out.mutable_lease() = rpc::ToProtoDuration(options_.lease);
  absl::MutexLock lock(&table_.mu());
  ScheduleLocked();
  return out;
}

absl::StatusOr<v1::HeartbeatResponse> JobManager::Heartbeat(const v1::HeartbeatRequest& req) {
  RETURN_IF_ERROR(registry_.Heartbeat(req.worker_id(), deps_.clock->Now(), req.session_token()));
  // Left for the tick: a heartbeat never waits for the job table's lock.
  if (req.has_progress()) progress_inbox_.Post(req.worker_id(), req.progress(), deps_.clock->Now());
  if (req.snapshot_jobs().empty()) return v1::HeartbeatResponse();
  return SnapshotKeepFrom(req.snapshot_jobs());
}

absl::StatusOr<RankSlot*> JobManager::ReportingSlotLocked(Job& job, const std::string& worker_id,
                                                          int attempt, int rank, int replica) {
  const int index = job.plan.TaskIndex(replica, rank);
  if (attempt != job.attempt || rank < 0 || rank >= job.plan.num_ranks || replica < 0 ||
      index >= static_cast<int>(job.ranks.size()) || job.ranks[index].worker_id != worker_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report from worker ", worker_id, " for ", job.id, " attempt ", attempt, " rank ", rank,
        " replica ", replica, " does not match the job's current placement"));
  }
  return &job.ranks[index];
}

absl::Status JobManager::ReportStep(const v1::ReportStepRequest& req) {
  absl::MutexLock lock(&table_.mu());
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(req.job_id()));
  if (IsFinal(job->state) || req.attempt() != job->attempt) {
    return absl::OkStatus();  // late report of a stopped job or of an earlier attempt
  }
  ASSIGN_OR_RETURN(RankSlot * slot, ReportingSlotLocked(*job, req.worker_id(), req.attempt(),
                                                        req.rank(), req.replica()));
  if (req.forward_only_step()) return aggregator_.AddForwardOnlyLocked(*job, *slot, req);
  if (req.checkpoint_only()) return ReportCheckpointOnlyLocked(*job, *slot, req);
  if (StepAggregator::IsCountedAlready(*slot, req)) return absl::OkStatus();
  RETURN_IF_ERROR(aggregator_.CheckLocked(*job, *slot, req));
  RETURN_IF_ERROR(ValidateCheckpointReport(*job, req));
  const bool completed = aggregator_.AddLocked(*job, *slot, req, deps_.clock->Now());
  if (completed && !job->step_failure.empty() && !IsFinal(job->state)) {
    // Replicas must hold the same bits (training on would average different models); a run of
    // skipped steps will not recover by itself.
    lifecycle_.EndLocked(*job, v1::JOB_STATE_FAILED, job->step_failure);
    ScheduleLocked();
    return absl::OkStatus();
  }
  if (std::optional<PendingManifest> pending = AddReportedFilesLocked(*job, req)) {
    QueueManifestLocked(*job, *std::move(pending));
  }
  if (completed && job->save_at_steps_done >= 0 && job->steps_done() >= job->save_at_steps_done) {
    job->save_at_steps_done = -1;
    table_.PersistLocked(*job);
  }
  if (completed) control_.AfterProgressLocked(*job);
  return absl::OkStatus();
}

absl::Status JobManager::ReportCheckpointOnlyLocked(Job& job, const RankSlot& slot,
                                                    const v1::ReportStepRequest& req) {
  RETURN_IF_ERROR(StepAggregator::CheckCheckpointOnly(slot, req));
  RETURN_IF_ERROR(ValidateCheckpointReport(job, req));
  if (std::optional<PendingManifest> pending = AddReportedFilesLocked(job, req)) {
    QueueManifestLocked(job, *std::move(pending));
  }
  return absl::OkStatus();
}

void JobManager::QueueManifestLocked(Job& job, PendingManifest pending) {
  ++job.manifests_in_flight;
  deps_.executor->Run(scope_.Wrap([this, pending = std::move(pending)] {
    const absl::Status written = WritePendingManifest(pending);
    absl::MutexLock lock(&table_.mu());
    Job* job = table_.FindLocked(pending.job_id);
    if (job == nullptr) return;
    --job->manifests_in_flight;
    if (written.ok()) {
      RecordCheckpointLocked(*job, pending);
      MaybeGrowLocked(*job, pending);
      // The record must hold the loss of every step before the checkpoint: when that step's
      // loss is not in yet, the record is saved again once it is (ReportStep).
      if (!job->forward_only() && job->steps_done() < pending.manifest.step - job->base_step) {
        job->save_at_steps_done = pending.manifest.step - job->base_step;
      }
      table_.PersistLocked(*job);
    } else {
      spdlog::error("{}: checkpoint at step {} left incomplete (no manifest): {}", job->id,
                    pending.manifest.step, written.message());
    }
    lifecycle_.MaybeSucceedLocked(*job);
    ScheduleLocked();
  }));
}

absl::Status JobManager::ReportTaskEnd(const v1::ReportTaskEndRequest& req) {
  absl::MutexLock lock(&table_.mu());
  ASSIGN_OR_RETURN(Job * job, table_.FindOrErrorLocked(req.job_id()));
  if (req.attempt() != job->attempt) return absl::OkStatus();  // an older attempt's task
  ASSIGN_OR_RETURN(RankSlot * slot, ReportingSlotLocked(*job, req.worker_id(), req.attempt(),
                                                        req.rank(), req.replica()));
  return lifecycle_.TaskEndedLocked(*job, *slot, req);
}

}  // namespace stagecoach::coordinator
