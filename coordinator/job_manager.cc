#include "coordinator/job_manager.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"
#include "common/schedule/action.h"
#include "common/spec/spec_overrides.h"
#include "common/spec/spec_parser.h"
#include "common/util/logging.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "coordinator/checkpoint_manifest.h"
#include "coordinator/schedule_view.h"

namespace stagecoach::coordinator {
namespace {

std::string WorkerLabel(const RankSlot& slot) {
  return absl::StrCat("worker ", slot.worker_id, " (rank ", slot.rank, ")");
}

v1::JobFailure LostFailure(const RankSlot& slot, const std::string& why) {
  v1::JobFailure failure;
  failure.set_rank(slot.rank);
  failure.set_worker_id(slot.worker_id);
  failure.set_error(absl::StrCat("lost: ", why));
  return failure;
}

// The first action (PyTorch syntax, e.g. "1RECV_F0") a worker's error message names; empty
// when it names none.
std::string FailedAction(const std::string& error) {
  for (absl::string_view word : absl::StrSplit(error, absl::ByAnyChar(" :,;()'\"\t\n"))) {
    if (word.size() < 2 || !absl::ascii_isdigit(word[0])) continue;
    auto action = schedule::ParseAction(word);
    if (action.ok() && action->has_value()) return std::string(word);
  }
  return "";
}

// A fresh secret for a worker's registration (RegisterWorkerResponse.session_token).
std::string NewSessionToken() {
  static absl::Mutex mu(absl::kConstInit);
  static std::random_device* device = new std::random_device();
  absl::MutexLock lock(&mu);
  std::string out;
  for (int i = 0; i < 8; ++i) out += absl::StrFormat("%08x", (*device)());
  return out;
}

// How often a waiting Infer call checks whether its caller went away.
constexpr absl::Duration kInferPoll = absl::Milliseconds(250);

// The spec of an Infer job: `spec_yaml` with a ForwardOnly schedule, `batch_size` rows and one
// step; schedule files, checkpoints and the data section do not apply to inference.
// With `keep_data` the data section stays (what profiling the model's layers measures on).
absl::StatusOr<std::string> InferenceSpecYaml(const std::string& spec_yaml,
                                              const std::string& origin, int64_t batch_size,
                                              bool keep_data = false) {
  spec::SpecOverrides overrides;
  overrides.set = {{"schedule.kind", "ForwardOnly"},
                   {"training.batch_size", absl::StrCat(batch_size)},
                   {"training.steps", "1"}};
  overrides.remove = {"schedule.csv", "schedule.csv_format", "schedule.csv_text",
                      "training.checkpoint"};
  if (!keep_data) overrides.remove.push_back("data");
  return spec::ApplySpecOverrides(spec_yaml, origin, overrides);
}

// The last stage's outputs of an Infer job are one tensor with a row per input row.
absl::Status CheckInferenceOutputs(const Job& job, const v1::ReportTaskEndRequest& req) {
  if (!req.has_inference_outputs()) return absl::InvalidArgumentError("inference_outputs: missing");
  const v1::TensorData& out = req.inference_outputs();
  RETURN_IF_ERROR(rpc::ValidateTensorData(out, "inference_outputs"));
  const int64_t rows = job.inference_inputs.shape(0);
  if (out.shape_size() < 1 || out.shape(0) != rows) {
    return absl::InvalidArgumentError(absl::StrCat("inference_outputs: expected ", rows,
                                                   " rows (one per input row), got ",
                                                   rpc::DescribeTensorData(out)));
  }
  return absl::OkStatus();
}

// Checkpoints (defined with the checkpoint code below ReportStep's helpers).
absl::StatusOr<std::optional<CheckpointManifest>> VerifyResumeFrom(const spec::JobSpec& spec,
                                                                   const Plan& plan);
void ApplyResume(const std::optional<CheckpointManifest>& checkpoint, Job* job);

// A job never overwrites a checkpoint: when training.checkpoint.dir already holds a step
// directory the job would write (every_steps apart from `base_step`, and the last step), it is
// refused at submit, naming the directory, rather than failing when it gets there.
absl::Status CheckCheckpointTargetsFree(const spec::JobSpec& spec, int64_t base_step) {
  const spec::CheckpointSpec& ckpt = spec.training.checkpoint;
  if (ckpt.dir.empty()) return absl::OkStatus();
  const int64_t last = base_step + spec.training.steps;
  std::error_code error;
  for (std::filesystem::directory_iterator it(ckpt.dir, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    const bool written = step == last || (ckpt.every_steps > 0 && step > base_step && step < last &&
                                          step % ckpt.every_steps == 0);
    if (written && it->path() == std::filesystem::path(CheckpointStepDirectory(ckpt.dir, step))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "training.checkpoint.dir: ", it->path().string(),
          " already exists (another job's checkpoint after step ", step,
          "); this job would write there, and checkpoints are never overwritten: use another "
          "directory or remove it"));
    }
  }
  return absl::OkStatus();
}

// Moves aside the step directories of `dir` after `after_step` that hold no manifest: partial
// checkpoints of an attempt that failed (or of tasks that ran on while the coordinator was
// down), which the next attempt would otherwise find in its way, since checkpoints are never
// overwritten. They become "step-<n>.partial-<tag>".
void SetAsidePartialCheckpoints(const std::string& dir, int64_t after_step,
                                const std::string& tag) {
  std::error_code error;
  std::vector<std::filesystem::path> partial;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    if (step <= after_step || it->path() != CheckpointStepDirectory(dir, step)) continue;
    if (std::filesystem::exists(ManifestPath(it->path().string()))) continue;
    partial.push_back(it->path());
  }
  for (const auto& path : partial) {
    std::filesystem::path aside = path;
    aside += absl::StrCat(".partial-", tag);
    std::error_code moved;
    std::filesystem::rename(path, aside, moved);
    if (moved) {
      spdlog::warn("cannot move partial checkpoint {} aside: {}", path.string(), moved.message());
    } else {
      spdlog::info("moved partial checkpoint {} to {}", path.string(), aside.string());
    }
  }
}

}  // namespace

JobManager::JobManager(JobManagerOptions options, JobManagerDeps deps)
    : options_(options),
      deps_(deps),
      registry_(options.lease),
      calls_(std::make_unique<WorkQueue>(options.worker_call_threads)) {}

JobManager::~JobManager() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
  calls_.reset();
}

void JobManager::Start() {
  ticker_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.tick_interval)) return;
      }
      Tick();
    }
  });
}

Job* JobManager::FindJob(const std::string& id) {
  for (Job& job : jobs_) {
    if (job.id == id) return &job;
  }
  return nullptr;
}

absl::StatusOr<Job*> JobManager::FindJobOrError(const std::string& id) {
  Job* job = FindJob(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return job;
}

absl::StatusOr<std::vector<v1::LayerInfo>> JobManager::ModelLayers(
    const spec::JobSpec& spec, const std::string& inspect_yaml, const PlanOptions& plan_options) {
  if (!NeedsInspection(spec)) return BuiltinLayers(*spec.model.builtin);
  // What the planner refuses anyway is refused before a worker is troubled.
  RETURN_IF_ERROR(CheckPlannable(spec, plan_options));
  const bool profile = NeedsProfile(spec);
  const std::string what = spec.model.torchscript.has_value()
                               ? "inspect model.torchscript"
                               : "profile the model's layers (split.policy profiled)";
  std::string worker_id, address;
  {
    absl::MutexLock lock(&mu_);
    // Prefer a worker of the job's device (profiled times are measured there), then an idle one.
    int best = -1;
    for (const WorkerRecord* w : registry_.All()) {
      if (w->state == v1::WORKER_STATE_LOST) continue;
      const int score = (DeviceMatches(spec.placement.device, w->device) ? 2 : 0) +
                        (w->state == v1::WORKER_STATE_IDLE ? 1 : 0);
      if (score > best) {
        best = score;
        worker_id = w->id;
        address = w->address;
      }
    }
  }
  if (worker_id.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no live worker to ", what, "; start a worker first"));
  }
  v1::InspectModelRequest request;
  request.set_spec_yaml(inspect_yaml);
  request.set_profile(profile);
  request.set_profile_iterations(options_.profile_iterations);
  auto inspected = deps_.workers->InspectModel(address, request, options_.inspect_timeout);
  if (!inspected.ok()) {
    const absl::Status& error = inspected.status();
    if (absl::IsInvalidArgument(error)) {
      // The worker's verdict on the spec (it names the field).
      return absl::InvalidArgumentError(
          absl::StrCat(error.message(), " (inspected by worker ", worker_id, ")"));
    }
    return absl::Status(error.code(), absl::StrCat("could not ", what, " on worker ", worker_id,
                                                   " at ", address, ": ", error.message()));
  }
  spdlog::info("worker {} inspected the model: {} layers{}", worker_id, inspected->layers_size(),
               profile ? ", profiled" : "");
  return std::vector<v1::LayerInfo>(inspected->layers().begin(), inspected->layers().end());
}

absl::StatusOr<std::string> JobManager::SubmitJob(const std::string& spec_yaml,
                                                  const std::string& origin, bool start_paused) {
  ASSIGN_OR_RETURN(spec::JobSpec spec, spec::ParseJobSpec(spec_yaml, origin));
  ASSIGN_OR_RETURN(std::vector<v1::LayerInfo> layers, ModelLayers(spec, spec_yaml, {}));
  ASSIGN_OR_RETURN(Plan plan, PlanJob(spec, std::move(layers)));
  ASSIGN_OR_RETURN(std::optional<CheckpointManifest> resume, VerifyResumeFrom(spec, plan));
  RETURN_IF_ERROR(CheckCheckpointTargetsFree(spec, resume.has_value() ? resume->step : 0));
  absl::MutexLock lock(&mu_);
  Job& job = AddJobLocked(std::move(spec), spec_yaml, std::move(plan));
  ApplyResume(resume, &job);
  job.attempt_base = job.base_step;
  job.finish_step = job.base_step + job.spec.training.steps;
  if (start_paused) job.hold_step = job.base_step;
  const std::string id = job.id;
  PersistLocked(job);
  ScheduleLocked();
  return id;
}

Job& JobManager::AddJobLocked(spec::JobSpec spec, std::string spec_yaml, Plan plan) {
  const absl::Time now = deps_.clock->Now();
  Job& job = jobs_.emplace_back();
  job.id = absl::StrCat("job-", next_job_++);
  job.spec = std::move(spec);
  job.spec_yaml = std::move(spec_yaml);
  job.plan = std::move(plan);
  job.created = now;
  // The spec was parsed, its model inspected and split before the job was added (a spec that
  // fails there is refused and nothing is queued), so PLANNING is already behind it.
  job.state = v1::JOB_STATE_PLANNING;
  v1::JobTransition created;
  created.set_state(v1::JOB_STATE_PLANNING);
  created.set_reason("submitted");
  *created.mutable_time() = rpc::ToProtoTimestamp(now);
  job.history.push_back(created);
  v1::JobEvent event;
  *event.mutable_state_change() = created;
  job.AddEvent(std::move(event), now);
  absl::Status queued =
      job.TransitionTo(v1::JOB_STATE_PENDING,
                       absl::StrCat("planned: ", job.plan.num_stages, " stages on ",
                                    job.plan.num_ranks, " workers, ", job.plan.schedule_name),
                       now);
  if (!queued.ok()) spdlog::error("{}: {}", job.id, queued.message());
  spdlog::info("{} submitted: {} stages on {} workers, {} x {} microbatches, {} steps", job.id,
               job.plan.num_stages, job.plan.num_ranks, job.plan.schedule_name,
               job.plan.num_microbatches, job.spec.training.steps);
  return job;
}

absl::StatusOr<InferenceResult> JobManager::Infer(const std::string& spec_yaml,
                                                  const std::string& origin, v1::TensorData inputs,
                                                  absl::Duration timeout,
                                                  const std::function<bool()>& caller_gone) {
  RETURN_IF_ERROR(rpc::ValidateTensorData(inputs, "inputs"));
  if (inputs.shape_size() < 1 || inputs.shape(0) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs.shape: needs at least one row (dim 0 is the batch), got ",
                     rpc::DescribeTensorData(inputs)));
  }
  const int64_t rows = inputs.shape(0);
  // Parsed first with the largest batch size, so that the microbatch count is checked against
  // the input's rows here rather than against a batch size the user never wrote.
  ASSIGN_OR_RETURN(std::string probe_yaml,
                   InferenceSpecYaml(spec_yaml, origin, std::numeric_limits<int64_t>::max()));
  ASSIGN_OR_RETURN(spec::JobSpec probe, spec::ParseJobSpec(probe_yaml, origin));
  if (probe.schedule.microbatches > rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule.microbatches: must be <= the rows of inputs (",
                     rpc::DescribeTensorData(inputs), "), got ", probe.schedule.microbatches));
  }
  ASSIGN_OR_RETURN(std::string job_yaml, InferenceSpecYaml(spec_yaml, origin, rows));
  ASSIGN_OR_RETURN(spec::JobSpec spec, spec::ParseJobSpec(job_yaml, origin));
  // The batch is the client's; profiled layer times are measured on the spec's own data.
  PlanOptions plan_options;
  plan_options.client_batches = true;
  std::string inspect_yaml = job_yaml;
  if (NeedsProfile(spec)) {
    ASSIGN_OR_RETURN(inspect_yaml, InferenceSpecYaml(spec_yaml, origin, rows, /*keep_data=*/true));
  }
  ASSIGN_OR_RETURN(std::vector<v1::LayerInfo> layers,
                   ModelLayers(spec, inspect_yaml, plan_options));
  ASSIGN_OR_RETURN(Plan plan, PlanJob(spec, std::move(layers), plan_options));
  // Inference on a checkpoint's weights (training.resume_from).
  ASSIGN_OR_RETURN(std::optional<CheckpointManifest> resume, VerifyResumeFrom(spec, plan));
  absl::MutexLock lock(&mu_);
  Job& job = AddJobLocked(std::move(spec), std::move(job_yaml), std::move(plan));
  ApplyResume(resume, &job);
  job.attempt_base = job.base_step;
  job.finish_step = job.base_step + 1;
  job.finishing = true;  // its tasks end on their own after their one step
  job.inference = true;
  job.inference_inputs = std::move(inputs);
  ScheduleLocked();
  return AwaitInferenceLocked(&job, timeout, caller_gone);
}

absl::StatusOr<InferenceResult> JobManager::AwaitInferenceLocked(
    Job* job, absl::Duration timeout, const std::function<bool()>& caller_gone) {
  const absl::Time deadline = absl::Now() + timeout;
  auto ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool done = stopping_ || IsFinal(job->state);
    return done;
  };
  while (!IsFinal(job->state)) {
    if (stopping_) {
      return absl::UnavailableError(absl::StrCat(job->id, ": the coordinator is shutting down"));
    }
    const absl::Duration left = deadline - absl::Now();
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
      EndJobLocked(job, v1::JOB_STATE_CANCELLED, why);
      job->inference_outputs.reset();
      ScheduleLocked();
      return absl::Status(code, absl::StrCat(job->id, ": ", why, "; the job was cancelled"));
    }
    mu_.AwaitWithTimeout(absl::Condition(&ended), std::min(left, kInferPoll));
  }
  // Only this call hands the outputs out; the job keeps none.
  std::optional<v1::TensorData> outputs = std::move(job->inference_outputs);
  job->inference_outputs.reset();
  switch (job->state) {
    case v1::JOB_STATE_SUCCEEDED:
      if (!outputs.has_value()) {
        return absl::InternalError(absl::StrCat(job->id, " succeeded without outputs"));
      }
      return InferenceResult{job->id, *std::move(outputs)};
    case v1::JOB_STATE_FAILED:
      return absl::AbortedError(absl::StrCat(job->id, " failed: ", job->reason));
    default:
      return absl::CancelledError(absl::StrCat(job->id, " was cancelled: ", job->reason));
  }
}

absl::StatusOr<v1::Job> JobManager::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  return FullProtoLocked(*job);
}

v1::Job JobManager::FullProtoLocked(const Job& job) {
  v1::Job out;
  job.ToProto(&out);
  // The plan's partition: the model's layers and each stage's share of them.
  for (const v1::LayerInfo& layer : job.plan.layers) *out.add_layers() = layer;
  for (const StagePlan& stage : job.plan.stages) {
    v1::StageAssignment* st = out.add_stages();
    st->set_stage(stage.stage);
    st->set_first_layer(stage.first_layer);
    st->set_end_layer(stage.end_layer);
    st->set_parameters(stage.parameters);
  }
  return out;
}

void JobManager::PersistLocked(const Job& job) {
  if (deps_.store == nullptr) return;
  absl::Status saved = deps_.store->Save(FullProtoLocked(job));
  if (!saved.ok()) spdlog::error("{}: not saved to the job table: {}", job.id, saved.message());
}

std::vector<v1::Job> JobManager::ListJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  for (const Job& job : jobs_) {
    v1::Job& summary = out.emplace_back();
    job.ToProto(&summary);
    // A summary: action lists and the spec grow with the job and are in GetJob.
    summary.clear_spec_yaml();
    for (v1::RankStatus& rank : *summary.mutable_ranks()) {
      rank.clear_assigned_actions();
      rank.clear_executed_actions();
    }
  }
  return out;
}

absl::StatusOr<v1::Job> JobManager::CancelJob(const std::string& job_id,
                                              const std::string& reason) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  if (IsFinal(job->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " has already ended (", JobStateName(job->state), ")"));
  }
  EndJobLocked(job, v1::JOB_STATE_CANCELLED, reason.empty() ? "cancelled by client" : reason);
  ScheduleLocked();
  v1::Job out;
  job->ToProto(&out);
  return out;
}

absl::StatusOr<JobEvents> JobManager::WaitForEvents(const std::string& job_id,
                                                    int64_t from_sequence, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || static_cast<int64_t>(job->events.size()) > from_sequence ||
           IsFinal(job->state);
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  JobEvents out;
  for (int64_t i = std::max<int64_t>(from_sequence, 0);
       i < static_cast<int64_t>(job->events.size()); ++i) {
    out.events.push_back(job->events[i]);
  }
  out.ended = IsFinal(job->state);
  return out;
}

std::vector<v1::WorkerInfo> JobManager::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  for (const WorkerRecord* w : registry_.All()) w->ToProto(&out.emplace_back());
  return out;
}

absl::StatusOr<v1::RegisterWorkerResponse> JobManager::RegisterWorker(
    const v1::RegisterWorkerRequest& req) {
  if (req.address().empty()) {
    return absl::InvalidArgumentError("address: required (host:port of the WorkerService)");
  }
  if (req.device().empty()) return absl::InvalidArgumentError("device: required");
  absl::MutexLock lock(&mu_);
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
  ScheduleLocked();
  out.set_worker_id(id);
  *out.mutable_heartbeat_interval() = rpc::ToProtoDuration(options_.heartbeat_interval);
  *out.mutable_lease() = rpc::ToProtoDuration(options_.lease);
  return out;
}

absl::Status JobManager::Heartbeat(const v1::HeartbeatRequest& req) {
  absl::MutexLock lock(&mu_);
  return registry_.Heartbeat(req.worker_id(), deps_.clock->Now(), req.session_token());
}

absl::StatusOr<RankSlot*> JobManager::ReportingSlot(Job* job, const std::string& worker_id,
                                                    int attempt, int rank) {
  if (attempt != job->attempt || rank < 0 || rank >= static_cast<int>(job->ranks.size()) ||
      job->ranks[rank].worker_id != worker_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("report from worker ", worker_id, " for ", job->id, " attempt ", attempt,
                     " rank ", rank, " does not match the job's current placement"));
  }
  return &job->ranks[rank];
}

// --- Checkpoints: resume verification, stage files of step reports, manifests. ---
namespace {

// training.resume_from of a planned job: the verified checkpoint (manifest present, every file
// with its size and SHA-256, the plan's stage count and each stage's layers), or nullopt when
// the spec has none. INVALID_ARGUMENT "training.resume_from: ..." otherwise.
absl::StatusOr<std::optional<CheckpointManifest>> VerifyResumeFrom(const spec::JobSpec& spec,
                                                                   const Plan& plan) {
  const std::string& dir = spec.training.resume_from;
  if (dir.empty()) return std::nullopt;
  auto refused = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("training.resume_from: ", why));
  };
  absl::StatusOr<CheckpointManifest> m = VerifyCheckpoint(dir);
  if (!m.ok()) return refused(m.status().message());
  if (m->num_stages != plan.num_stages) {
    return refused(absl::StrCat("checkpoint ", dir, " has ", m->num_stages,
                                " stages, this job's plan has ", plan.num_stages,
                                " (set split.stages or split.points to match it)"));
  }
  for (int s = 0; s < plan.num_stages; ++s) {
    const ManifestStage& saved = m->stages[s];
    const StagePlan& planned = plan.stages[s];
    if (saved.first_layer != planned.first_layer || saved.end_layer != planned.end_layer) {
      return refused(absl::StrCat("stage ", s, " holds layers [", saved.first_layer, ", ",
                                  saved.end_layer, ") in checkpoint ", dir, ", layers [",
                                  planned.first_layer, ", ", planned.end_layer,
                                  ") in this job's plan"));
    }
    if (saved.layers.empty()) continue;
    for (int l = planned.first_layer; l < planned.end_layer; ++l) {
      const size_t i = static_cast<size_t>(l - planned.first_layer);
      if (l < static_cast<int>(plan.layers.size()) && i < saved.layers.size() &&
          plan.layers[l].name() != saved.layers[i]) {
        return refused(absl::StrCat("stage ", s, " layer ", l, " is '", saved.layers[i],
                                    "' in checkpoint ", dir, ", '", plan.layers[l].name(),
                                    "' in this job's model"));
      }
    }
  }
  return std::optional<CheckpointManifest>(*std::move(m));
}

// Makes `job` start from `checkpoint` (VerifyResumeFrom's answer).
void ApplyResume(const std::optional<CheckpointManifest>& checkpoint, Job* job) {
  if (!checkpoint.has_value()) return;
  v1::JobCheckpoint from;
  from.set_step(checkpoint->step);
  from.set_directory(job->spec.training.resume_from);
  from.set_manifest(ManifestPath(job->spec.training.resume_from));
  job->resumed_from = from;
  job->base_step = checkpoint->step;
  job->resume_files.clear();
  for (const ManifestStage& st : checkpoint->stages) job->resume_files.push_back(st.files);
  spdlog::info("{} resumes from {} (step {})", job->id, from.directory(), from.step());
}

// The checkpoint part of a step report: global_step, when set, is the job's base step plus the
// steps done; every file belongs to a stage the reporting rank owns and has a plain name, a
// size and a checksum.
absl::Status ValidateCheckpointReport(const Job& job, const v1::ReportStepRequest& req) {
  const int64_t global_step = job.attempt_base + req.step() + 1;
  if (req.global_step() != 0 && req.global_step() != global_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_step: rank ", req.rank(), " reported ", req.global_step(),
                     " after step ", req.step(), ", expected ", global_step, " (", job.attempt_base,
                     " steps before this attempt + ", req.step() + 1, ")"));
  }
  if (req.checkpoint_files_size() == 0) return absl::OkStatus();
  if (job.spec.training.checkpoint.dir.empty() || job.forward_only()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_files: rank ", req.rank(), " reported a checkpoint, but job ", job.id,
        job.forward_only() ? " is forward-only" : " has no training.checkpoint.dir"));
  }
  for (const v1::StageCheckpointFile& f : req.checkpoint_files()) {
    if (f.stage() < 0 || f.stage() >= job.plan.num_stages ||
        job.plan.stage_to_rank[f.stage()] != req.rank()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint_files: rank ", req.rank(),
                                                     " reported a file of stage ", f.stage(),
                                                     ", which it does not own"));
    }
    if (f.file().empty() || f.file().find('/') != std::string::npos ||
        f.file() == kManifestFileName || f.size_bytes() < 0 || !IsSha256Hex(f.sha256())) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint_files: stage ", f.stage(), " file '", f.file(),
                       "' needs a plain file name, a size and a 64-digit sha256"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void JobManager::CollectCheckpointFilesLocked(Job* job, const v1::ReportStepRequest& req) {
  if (req.checkpoint_files_size() == 0) return;
  const int64_t step = job->attempt_base + req.step() + 1;
  auto& stages = job->checkpoint_files[step];
  for (const v1::StageCheckpointFile& f : req.checkpoint_files()) stages[f.stage()].push_back(f);
  if (static_cast<int>(stages.size()) < job->plan.num_stages) return;

  // Every stage's files are in: check them on disk, then write the manifest, last.
  const std::string dir = CheckpointStepDirectory(job->spec.training.checkpoint.dir, step);
  CheckpointManifest m;
  m.job_id = job->id;
  m.step = step;
  m.data_position = step;
  m.num_stages = job->plan.num_stages;
  m.schedule = job->plan.schedule_name;
  m.model_json = ModelReferenceJson(job->spec.model);
  absl::Status status;
  for (int s = 0; s < job->plan.num_stages; ++s) {
    ManifestStage& st = m.stages.emplace_back();
    st.stage = s;
    st.first_layer = job->plan.stages[s].first_layer;
    st.end_layer = job->plan.stages[s].end_layer;
    for (int l = st.first_layer; l < st.end_layer && l < static_cast<int>(job->plan.layers.size());
         ++l) {
      st.layers.push_back(job->plan.layers[l].name());
    }
    st.files = stages[s];
    for (const v1::StageCheckpointFile& f : st.files) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(std::filesystem::path(dir) / f.file(), ec);
      if (status.ok() && (ec || static_cast<int64_t>(size) != f.size_bytes())) {
        status = absl::DataLossError(
            ec ? absl::StrCat(f.file(), " (stage ", s, ") is not in ", dir, ": ", ec.message())
               : absl::StrCat(f.file(), " (stage ", s, ") in ", dir, " has ", size,
                              " bytes, its rank reported ", f.size_bytes()));
      }
    }
  }
  job->checkpoint_files.erase(step);
  if (status.ok()) status = WriteManifest(dir, m);
  if (!status.ok()) {
    spdlog::error("{}: checkpoint at step {} left incomplete (no manifest): {}", job->id, step,
                  status.message());
    return;
  }
  job->checkpoint_stage_files[step].clear();
  for (const ManifestStage& st : m.stages) job->checkpoint_stage_files[step].push_back(st.files);
  v1::JobCheckpoint& done = job->checkpoints.emplace_back();
  done.set_step(step);
  done.set_directory(dir);
  done.set_manifest(ManifestPath(dir));
  spdlog::info("{}: checkpoint at step {} complete: {}", job->id, step, done.manifest());
  PersistLocked(*job);
}

absl::StatusOr<v1::CheckpointJobResponse> JobManager::CheckpointJob(const std::string& job_id) {
  constexpr int kTries = 5;
  bool paused = false;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
    paused = job->state == v1::JOB_STATE_PAUSED;
  }
  // A paused job writes the state it holds.
  if (paused) return CheckpointPausedJob(job_id);
  std::vector<std::pair<int, std::string>> ranks;  // rank, worker address
  v1::CheckpointJobResponse response;
  int64_t last = 0;  // the job's final global step
  std::string dir;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
    if (job->state != v1::JOB_STATE_RUNNING) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", JobStateName(job->state),
                       "; only a RUNNING or PAUSED job checkpoints"));
    }
    if (job->forward_only()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is forward-only; it has no training state to save"));
    }
    dir = job->spec.training.checkpoint.dir;
    if (dir.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, ": its spec has no training.checkpoint.dir"));
    }
    int64_t furthest = 0;
    for (const RankSlot& slot : job->ranks) {
      furthest = std::max(furthest, slot.steps_done);
      ranks.emplace_back(slot.rank, slot.worker_address);
    }
    // Step `furthest` (from 0) is the earliest no rank has finished; after it the timeline holds
    // base + furthest + 1 steps.
    response.set_step(job->attempt_base + furthest + 1);
    last = job->finish_step;
  }
  absl::Status failure;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    if (response.step() >= last) {
      // The end-of-job checkpoint is written anyway.
      response.set_step(last);
      response.set_directory(CheckpointStepDirectory(dir, last));
      return response;
    }
    failure = absl::OkStatus();
    for (const auto& [rank, address] : ranks) {
      absl::Status asked = deps_.workers->RequestCheckpoint(address, job_id, response.step(),
                                                            options_.worker_rpc_timeout);
      if (!asked.ok()) {
        failure = absl::Status(asked.code(),
                               absl::StrCat("job ", job_id, " rank ", rank, ": ", asked.message()));
        break;
      }
    }
    if (failure.ok()) {
      response.set_directory(CheckpointStepDirectory(dir, response.step()));
      spdlog::info("{}: checkpoint requested after step {} in {}", job_id, response.step(),
                   response.directory());
      return response;
    }
    if (!absl::IsFailedPrecondition(failure)) return failure;
    // A rank has already passed that step: ask for the next one.
    response.set_step(response.step() + 1);
  }
  return absl::AbortedError(absl::StrCat("checkpoint of ", failure.message(), " (asked ", kTries,
                                         " times for later steps)"));
}

absl::Status JobManager::ReportStep(const v1::ReportStepRequest& req) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(req.job_id()));
  if (IsFinal(job->state) || req.attempt() != job->attempt) {
    return absl::OkStatus();  // late report of a stopped job or of an earlier attempt
  }
  ASSIGN_OR_RETURN(RankSlot * slot, ReportingSlot(job, req.worker_id(), req.attempt(), req.rank()));
  if (req.forward_only_step()) return ReportForwardOnlyStepLocked(job, slot, req);
  if (req.checkpoint_only()) {
    // A held rank's checkpoint of where it holds (a paused job's CheckpointJob).
    if (req.step() != slot->steps_done - 1 || req.checkpoint_files_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint_only: rank ", req.rank(), " must report its files at its last step (",
          slot->steps_done - 1, "), got step ", req.step(), " with ", req.checkpoint_files_size(),
          " files"));
    }
    RETURN_IF_ERROR(ValidateCheckpointReport(*job, req));
    CollectCheckpointFilesLocked(job, req);
    return absl::OkStatus();
  }
  if (req.step() != slot->steps_done) {
    return absl::InvalidArgumentError(absl::StrCat("step: rank ", req.rank(), " reported step ",
                                                   req.step(), ", expected ", slot->steps_done));
  }
  const int last_stage = job->plan.num_stages - 1;
  const bool owns_last = job->plan.stage_to_rank[last_stage] == req.rank();
  const bool forward_only = job->forward_only();
  if (owns_last && !forward_only && req.microbatch_losses_size() != job->plan.num_microbatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatch_losses: the last stage's rank must report ",
                     job->plan.num_microbatches, " losses, got ", req.microbatch_losses_size()));
  }
  if (req.action_timings_size() != 0 && req.action_timings_size() != req.executed_actions_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("action_timings: expected one per executed action (",
                     req.executed_actions_size(), "), got ", req.action_timings_size()));
  }
  RETURN_IF_ERROR(ValidateCheckpointReport(*job, req));
  slot->steps_done = req.step() + 1;
  slot->bytes_sent += req.bytes_sent();
  slot->bytes_received += req.bytes_received();
  for (const auto& [peer, bytes] : req.bytes_sent_to()) slot->bytes_sent_to[peer] += bytes;
  for (const auto& [peer, bytes] : req.bytes_received_from()) {
    slot->bytes_received_from[peer] += bytes;
  }
  if (deps_.metrics) deps_.metrics->AddDataPlaneBytes(req.bytes_sent(), req.bytes_received());
  slot->parameters = req.parameters();
  slot->executed_actions.assign(req.executed_actions().begin(), req.executed_actions().end());
  const int64_t global = job->attempt_base + req.step();  // the step's number in the timeline
  if (req.action_timings_size() > 0) {
    job->traces.Add(global,
                    RankStepTiming{req.rank(),
                                   {req.executed_actions().begin(), req.executed_actions().end()},
                                   {req.action_timings().begin(), req.action_timings().end()},
                                   rpc::FromProtoTimestamp(req.step_start_time())});
  }
  CollectCheckpointFilesLocked(job, req);

  StepAggregate& agg = job->partial_steps[req.step()];
  ++agg.ranks_reported;
  const absl::Duration step_time = rpc::FromProtoDuration(req.step_time());
  agg.slowest = std::max(agg.slowest, step_time);
  if (owns_last && !forward_only) {
    agg.microbatch_losses.assign(req.microbatch_losses().begin(), req.microbatch_losses().end());
  }
  agg.bubble_ratios.resize(job->plan.num_ranks, 0.0);
  agg.bubble_ratios[req.rank()] = req.bubble_ratio();
  if (req.client_batch()) agg.client_batch = true;
  if (agg.ranks_reported < job->plan.num_ranks) return absl::OkStatus();

  ++job->steps_completed;
  // Steps after a restart's checkpoint replace those the failed attempt had recorded.
  const size_t index = static_cast<size_t>(global - job->base_step);
  job->max_bubble_ratios.resize(index);
  job->max_bubble_ratios.push_back(
      *std::max_element(agg.bubble_ratios.begin(), agg.bubble_ratios.end()));
  v1::JobEvent event;
  v1::StepCompleted* step = event.mutable_step_completed();
  step->set_step(global - job->base_step);
  step->set_global_step(global);
  step->set_steps_total(job->finish_step - job->base_step);
  step->set_client_batch(agg.client_batch);
  if (!forward_only) {
    const double loss =
        std::accumulate(agg.microbatch_losses.begin(), agg.microbatch_losses.end(), 0.0) /
        static_cast<double>(agg.microbatch_losses.size());
    job->losses.resize(index);
    job->losses.push_back(loss);
    step->set_loss(loss);
  }
  *step->mutable_step_time() = rpc::ToProtoDuration(agg.slowest);
  for (double ratio : agg.bubble_ratios) step->add_bubble_ratios(ratio);
  const double seconds = absl::ToDoubleSeconds(agg.slowest);
  step->set_samples_per_second(seconds > 0 ? job->spec.training.batch_size / seconds : 0.0);
  if (deps_.metrics) {
    deps_.metrics->StepCompleted(job->id, agg.slowest,
                                 forward_only ? std::nullopt : std::optional<double>(step->loss()),
                                 step->samples_per_second(), agg.bubble_ratios);
  }
  // A client batch step (StepJob) hands its losses to its caller.
  if (job->client_step.has_value() && !job->client_step->forward_only &&
      job->client_step->global_step == global) {
    job->client_step->losses = agg.microbatch_losses;
    job->client_step->slowest = agg.slowest;
    job->client_step->done = true;
  }
  job->AddEvent(std::move(event), deps_.clock->Now());
  job->partial_steps.erase(req.step());
  MaybePauseLocked(job);
  MaybeFinishLocked(job);
  return absl::OkStatus();
}

absl::Status JobManager::ReportForwardOnlyStepLocked(Job* job, RankSlot* slot,
                                                     const v1::ReportStepRequest& req) {
  if (!job->client_step.has_value() || !job->client_step->forward_only ||
      req.global_step() != job->client_step->global_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward_only_step: rank ", req.rank(), " of ", job->id,
                     " reported a forward-only client step at global step ", req.global_step(),
                     ", but none is in flight there"));
  }
  Job::ClientStepState& cs = *job->client_step;
  const bool owns_last = job->plan.stage_to_rank[job->plan.num_stages - 1] == slot->rank;
  if (owns_last) {
    if (!req.has_outputs()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs: rank ", req.rank(), " owns the last stage and must send its outputs"));
    }
    RETURN_IF_ERROR(rpc::ValidateTensorData(req.outputs(), "outputs"));
    if (req.outputs().shape_size() < 1 || req.outputs().shape(0) != cs.rows) {
      return absl::InvalidArgumentError(absl::StrCat("outputs: expected ", cs.rows,
                                                     " rows (one per input row), got ",
                                                     rpc::DescribeTensorData(req.outputs())));
    }
    cs.outputs = req.outputs();
  }
  cs.slowest = std::max(cs.slowest, rpc::FromProtoDuration(req.step_time()));
  if (++cs.ranks_reported == job->plan.num_ranks) cs.done = true;
  return absl::OkStatus();
}

absl::Status JobManager::ReportTaskEnd(const v1::ReportTaskEndRequest& req) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(req.job_id()));
  if (req.attempt() != job->attempt) return absl::OkStatus();  // an older attempt's task
  ASSIGN_OR_RETURN(RankSlot * slot, ReportingSlot(job, req.worker_id(), req.attempt(), req.rank()));
  if (slot->task_ended) return absl::OkStatus();
  slot->task_ended = true;
  slot->outcome = req.outcome();
  slot->error = req.error();
  registry_.Release(slot->worker_id, job->id);
  if (IsFinal(job->state) || job->state == v1::JOB_STATE_RESTARTING) {
    ScheduleLocked();  // a restarting job waits for its workers to be released
    return absl::OkStatus();
  }
  switch (req.outcome()) {
    case v1::TASK_OUTCOME_SUCCEEDED: {
      if (job->inference && job->plan.stage_to_rank[job->plan.num_stages - 1] == req.rank()) {
        absl::Status outputs = CheckInferenceOutputs(*job, req);
        if (!outputs.ok()) {
          EndJobLocked(job, v1::JOB_STATE_FAILED,
                       absl::StrCat("rank ", req.rank(), " (worker ", req.worker_id(),
                                    ") returned unusable inference outputs: ", outputs.message()));
          break;
        }
        job->inference_outputs = req.inference_outputs();
      }
      const bool all = std::all_of(job->ranks.begin(), job->ranks.end(), [](const RankSlot& s) {
        return s.task_ended && s.outcome == v1::TASK_OUTCOME_SUCCEEDED;
      });
      if (all) {
        EndJobLocked(job, v1::JOB_STATE_SUCCEEDED,
                     absl::StrCat("all ", job->steps_done(), " steps done"));
      }
      break;
    }
    case v1::TASK_OUTCOME_FAILED:
    case v1::TASK_OUTCOME_STOPPED: {
      // A rank that stops on its own (not asked to) is a failure too.
      const std::string error = req.error().empty() ? "task stopped" : req.error();
      spdlog::warn("{} rank {} on {} failed: {}", job->id, req.rank(), req.worker_id(), error);
      const std::string job_id = job->id;
      const int attempt = job->attempt;
      const int rank = req.rank();
      calls_->Enqueue([this, job_id, attempt, rank, error] {
        InvestigateFailure(job_id, attempt, rank, error);
      });
      break;
    }
    default:
      return absl::InvalidArgumentError("outcome: required");
  }
  ScheduleLocked();
  return absl::OkStatus();
}

void JobManager::InvestigateFailure(const std::string& job_id, int attempt, int rank,
                                    const std::string& error) {
  std::vector<std::pair<std::string, std::string>> suspects;  // worker id, address
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr || job->attempt != attempt || IsFinal(job->state) ||
        job->state == v1::JOB_STATE_RESTARTING) {
      return;
    }
    for (const RankSlot& slot : job->ranks) {
      if (slot.rank != rank && !slot.task_ended) {
        suspects.emplace_back(slot.worker_id, slot.worker_address);
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> lost;  // worker id, why
  for (const auto& [worker_id, address] : suspects) {
    auto status = deps_.workers->GetStatus(address, options_.probe_timeout);
    if (!status.ok()) {
      lost.emplace_back(worker_id, absl::StrCat("unreachable: ", status.status().message()));
    }
  }
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  for (const auto& [worker_id, why] : lost) {
    registry_.MarkLost(worker_id, why);
  }
  if (job == nullptr || job->attempt != attempt || IsFinal(job->state) ||
      job->state == v1::JOB_STATE_RESTARTING) {
    return;
  }
  std::string reason;
  v1::JobFailure failure;
  for (const auto& [worker_id, why] : lost) {
    for (const RankSlot& slot : job->ranks) {
      if (slot.worker_id == worker_id) {
        absl::StrAppend(&reason, reason.empty() ? "" : "; ", WorkerLabel(slot), " lost: ", why);
        if (failure.worker_id().empty()) {
          failure.set_rank(slot.rank);
          failure.set_worker_id(worker_id);
          failure.set_error(absl::StrCat("lost: ", why));
        }
      }
    }
  }
  const RankSlot& reporter = job->ranks[rank];
  if (reason.empty()) {
    reason = absl::StrCat("rank ", rank, " (worker ", reporter.worker_id, ") failed: ", error);
    failure.set_rank(rank);
    failure.set_worker_id(reporter.worker_id);
    failure.set_error(error);
    failure.set_action(FailedAction(error));
  } else {
    absl::StrAppend(&reason, " (rank ", rank, " reported: ", error, ")");
  }
  FailOrRestartLocked(job, failure, reason);
  ScheduleLocked();
}

void JobManager::Tick() {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : registry_.ExpireLeases(deps_.clock->Now())) {
    const WorkerRecord* w = registry_.Find(id);
    spdlog::warn("worker {} lost: {}", id, w->reason);
    // The registry already marked it LOST; fail its job.
    for (Job& job : jobs_) {
      if (IsFinal(job.state)) continue;
      if (job.state == v1::JOB_STATE_RESTARTING) continue;
      for (const RankSlot& slot : job.ranks) {
        if (slot.worker_id == id && !slot.task_ended) {
          FailOrRestartLocked(&job, LostFailure(slot, w->reason),
                              absl::StrCat(WorkerLabel(slot), " lost: ", w->reason));
          break;
        }
      }
    }
  }
  ScheduleLocked();
  UpdateStateMetricsLocked();
}

void JobManager::UpdateStateMetricsLocked() {
  if (deps_.metrics == nullptr) return;
  std::map<v1::JobState, int> jobs;
  for (const Job& job : jobs_) ++jobs[job.state];
  deps_.metrics->SetJobCounts(jobs);
  std::map<v1::WorkerState, int> workers;
  for (const WorkerRecord* w : registry_.All()) ++workers[w->state];
  deps_.metrics->SetWorkerCounts(workers);
}

void JobManager::LoseWorkerLocked(const std::string& worker_id, const std::string& why) {
  registry_.MarkLost(worker_id, why);
  for (Job& job : jobs_) {
    if (IsFinal(job.state) || job.state == v1::JOB_STATE_RESTARTING) continue;
    for (const RankSlot& slot : job.ranks) {
      if (slot.worker_id == worker_id && !slot.task_ended) {
        FailOrRestartLocked(&job, LostFailure(slot, why),
                            absl::StrCat(WorkerLabel(slot), " lost: ", why));
        break;
      }
    }
  }
}

void JobManager::ScheduleLocked() {
  bool blocked = false;  // an older waiting job is waiting: later ones queue behind it
  std::string blocker;
  for (Job& job : jobs_) {
    const bool restarting = job.state == v1::JOB_STATE_RESTARTING;
    if ((job.state != v1::JOB_STATE_PENDING && !restarting) || job.starting) continue;
    if (restarting) {
      // Its previous attempt's workers must be free of it first (StopTask returned).
      const std::vector<const WorkerRecord*> all = registry_.All();
      const bool held = std::any_of(all.begin(), all.end(), [&](const WorkerRecord* w) {
        return w->state == v1::WORKER_STATE_BUSY && w->job_id == job.id;
      });
      if (held) continue;
    }
    const int needed = job.plan.num_ranks;
    std::vector<const WorkerRecord*> idle =
        registry_.Idle(job.spec.placement.device, job.plan.transport);
    const std::string device = job.spec.placement.device;
    // A restarting job keeps its cause in view while it waits.
    const std::string waiting =
        restarting && !job.history.empty() ? absl::StrCat(job.history.back().reason(), "; ") : "";
    if (blocked) {
      job.reason = absl::StrCat(waiting, "queued behind ", blocker, "; needs ", needed, " ", device,
                                " workers");
      continue;
    }
    if (static_cast<int>(idle.size()) < needed) {
      job.reason =
          absl::StrCat(waiting, "waiting for ", needed, " workers, ", idle.size(), " free");
      if (device != "cpu") {
        absl::StrAppend(&job.reason, " (device ", device, ", transport ", job.plan.transport, ")");
      }
      blocked = true;
      blocker = job.id;
      continue;
    }
    // Where the attempt starts: a restart continues from the latest complete checkpoint.
    std::optional<v1::JobCheckpoint> from = job.resumed_from;
    std::vector<std::vector<v1::StageCheckpointFile>> from_files = job.resume_files;
    job.restored.reset();
    if (restarting && !job.checkpoints.empty()) {
      const v1::JobCheckpoint& latest = job.checkpoints.back();
      auto files = job.checkpoint_stage_files.find(latest.step());
      if (files != job.checkpoint_stage_files.end() &&
          static_cast<int>(files->second.size()) == job.plan.num_stages) {
        from = latest;
        from_files = files->second;
        job.restored = latest;
      }
    }
    job.attempt_base = from.has_value() ? from->step() : job.base_step;
    if (job.hold_step >= 0 && job.hold_step < job.attempt_base) job.hold_step = -1;
    job.losses.resize(std::min<size_t>(job.losses.size(), job.attempt_base - job.base_step));
    job.max_bubble_ratios.resize(
        std::min<size_t>(job.max_bubble_ratios.size(), job.attempt_base - job.base_step));
    job.traces.DropAfter(job.attempt_base - 1);
    job.steps_completed = 0;
    job.pausing = false;
    job.finishing = job.inference;
    if (restarting && !job.spec.training.checkpoint.dir.empty()) {
      SetAsidePartialCheckpoints(job.spec.training.checkpoint.dir, job.attempt_base,
                                 absl::StrCat("attempt-", job.attempt));
    }
    const int64_t step_limit = job.hold_step >= 0 ? job.hold_step : job.finish_step;
    // Place: ranks in registration order of the free workers.
    ++job.attempt;
    job.starting = true;
    job.ranks.clear();
    job.partial_steps.clear();
    job.checkpoint_files.clear();
    std::vector<std::pair<std::string, v1::TaskAssignment>> tasks;
    std::vector<std::string> names;
    for (int r = 0; r < needed; ++r) {
      const WorkerRecord* w = idle[r];
      RankSlot& slot = job.ranks.emplace_back();
      slot.rank = r;
      slot.worker_id = w->id;
      slot.worker_address = w->address;
      for (int s = 0; s < job.plan.num_stages; ++s) {
        if (job.plan.stage_to_rank[s] == r) slot.stages.push_back(s);
      }
      for (const auto& action : job.plan.lowered[r]) {
        if (action.has_value()) slot.actions.push_back(action->ToString());
      }
      v1::TaskAssignment task;
      task.set_job_id(job.id);
      task.set_attempt(job.attempt);
      task.set_rank(r);
      task.set_world_size(needed);
      task.set_num_stages(job.plan.num_stages);
      for (int owner : job.plan.stage_to_rank) task.add_stage_to_rank(owner);
      for (int s : slot.stages) {
        v1::StageAssignment* st = task.add_stages();
        st->set_stage(s);
        st->set_first_layer(job.plan.stages[s].first_layer);
        st->set_end_layer(job.plan.stages[s].end_layer);
        st->set_parameters(job.plan.stages[s].parameters);
      }
      for (const v1::LayerInfo& layer : job.plan.layers) task.add_layer_names(layer.name());
      for (const StagePlan& stage : job.plan.stages) {
        task.add_stage_first_layers(stage.first_layer);
      }
      for (const auto& a : slot.actions) task.add_actions(a);
      task.set_spec_yaml(job.spec_yaml);
      task.set_rendezvous_prefix(job.RendezvousPrefix());
      task.set_transport(job.plan.transport);
      *task.mutable_comm_timeout() = rpc::ToProtoDuration(options_.comm_timeout);
      task.set_forward_only(job.forward_only());
      task.set_step_limit(step_limit);
      task.set_finish_at_limit(job.inference);
      *task.mutable_hold_timeout() = rpc::ToProtoDuration(options_.hold_timeout);
      if (!job.forward_only() && !job.spec.training.checkpoint.dir.empty()) {
        task.add_checkpoint_steps(job.finish_step);
      }
      if (from.has_value()) {
        v1::ResumeTask* resume = task.mutable_resume();
        resume->set_directory(from->directory());
        resume->set_step(from->step());
        for (int s : slot.stages) {
          for (const v1::StageCheckpointFile& f : from_files[s]) *resume->add_files() = f;
        }
      }
      if (job.inference) {
        v1::InferenceTask* inference = task.mutable_inference();
        if (job.plan.stage_to_rank[0] == r) *inference->mutable_inputs() = job.inference_inputs;
      }
      tasks.emplace_back(w->address, std::move(task));
      names.push_back(w->id);
    }
    for (int r = 0; r < needed; ++r) {
      absl::Status assigned = registry_.Assign(job.ranks[r].worker_id, job.id, r);
      if (!assigned.ok()) spdlog::error("{}: {}", job.id, assigned.message());
    }
    const std::string placed = absl::StrCat(
        "starting attempt ", job.attempt, " on ", absl::StrJoin(names, ", "),
        from.has_value() ? absl::StrCat(" from the checkpoint after step ", from->step()) : "");
    absl::Status moved = job.TransitionTo(v1::JOB_STATE_STARTING, placed, deps_.clock->Now());
    if (!moved.ok()) spdlog::error("{}: {}", job.id, moved.message());
    spdlog::info("{} {}", job.id, placed);
    PersistLocked(job);
    const std::string id = job.id;
    const int attempt = job.attempt;
    calls_->Enqueue([this, id, attempt, tasks = std::move(tasks)]() mutable {
      StartTasks(id, attempt, std::move(tasks));
    });
  }
}

void JobManager::StartTasks(const std::string& job_id, int attempt,
                            std::vector<std::pair<std::string, v1::TaskAssignment>> tasks) {
  absl::Status failure;
  int failed_rank = -1;
  for (const auto& [address, task] : tasks) {
    absl::Status started = deps_.workers->StartTask(address, task, options_.worker_rpc_timeout);
    if (!started.ok()) {
      failure = started;
      failed_rank = task.rank();
      break;
    }
  }
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr || job->attempt != attempt) return;
  job->starting = false;
  if (job->state != v1::JOB_STATE_STARTING) {
    // Cancelled, failed or restarting meanwhile: stop what was started (StopTask is
    // idempotent).
    for (const RankSlot& slot : job->ranks) StopRankLocked(*job, slot, job->reason);
    return;
  }
  if (!failure.ok()) {
    const RankSlot& slot = job->ranks[failed_rank];
    const bool unreachable = absl::IsUnavailable(failure) || absl::IsDeadlineExceeded(failure);
    if (unreachable) {
      registry_.MarkLost(slot.worker_id, absl::StrCat("unreachable: ", failure.message()));
    }
    v1::JobFailure cause;
    cause.set_rank(failed_rank);
    cause.set_worker_id(slot.worker_id);
    cause.set_error(absl::StrCat("StartTask: ", failure.message()));
    const std::string reason = absl::StrCat("could not start rank ", failed_rank, " on worker ",
                                            slot.worker_id, ": ", failure.message());
    // Only a worker that vanished is worth another attempt; a refused task would be refused
    // again.
    if (unreachable) {
      FailOrRestartLocked(job, cause, reason);
    } else {
      job->failure = cause;
      EndJobLocked(job, v1::JOB_STATE_FAILED, reason);
    }
    ScheduleLocked();
    return;
  }
  const bool held = job->hold_step >= 0 && job->hold_step == job->attempt_base;
  absl::Status moved =
      job->TransitionTo(held ? v1::JOB_STATE_PAUSED : v1::JOB_STATE_RUNNING,
                        held ? absl::StrCat("holding at global step ", job->hold_step, " on ",
                                            job->ranks.size(), " workers")
                             : absl::StrCat("running on ", job->ranks.size(), " workers"),
                        deps_.clock->Now());
  if (!moved.ok()) spdlog::error("{}: {}", job->id, moved.message());
  PersistLocked(*job);
  MaybeFinishLocked(job);
}

void JobManager::EndJobLocked(Job* job, v1::JobState state, const std::string& reason) {
  absl::Status moved = job->TransitionTo(state, reason, deps_.clock->Now());
  if (!moved.ok()) {
    spdlog::error("{}: {}", job->id, moved.message());
    return;
  }
  spdlog::info("{} {}: {}", job->id, JobStateName(state), reason);
  PersistLocked(*job);
  deps_.kv->DeletePrefix(job->RendezvousPrefix());
  // A finished Infer job needs only its outputs.
  job->inference_inputs.Clear();
  if (job->starting) return;  // StartTasks stops the ranks once its calls return
  for (const RankSlot& slot : job->ranks) {
    if (!slot.task_ended) StopRankLocked(*job, slot, reason);
  }
}

void JobManager::StopRankLocked(const Job& job, const RankSlot& slot, const std::string& reason) {
  const WorkerRecord* w = registry_.Find(slot.worker_id);
  if (w == nullptr || w->state == v1::WORKER_STATE_LOST) return;
  const std::string job_id = job.id;
  const std::string worker_id = slot.worker_id;
  const std::string address = slot.worker_address;
  calls_->Enqueue([this, job_id, worker_id, address, reason] {
    absl::Status stopped =
        deps_.workers->StopTask(address, job_id, reason, options_.worker_rpc_timeout);
    absl::MutexLock lock(&mu_);
    if (stopped.ok()) {
      registry_.Release(worker_id, job_id);
    } else {
      spdlog::warn("stopping {} on {}: {}", job_id, worker_id, stopped.message());
      LoseWorkerLocked(worker_id, absl::StrCat("could not stop its task: ", stopped.message()));
    }
    ScheduleLocked();
  });
}

// --- The job table on disk ---

std::vector<std::string> JobManager::Recover() {
  std::vector<std::string> problems;
  if (deps_.store == nullptr) return problems;
  std::vector<v1::Job> saved = deps_.store->LoadAll(&problems);
  absl::MutexLock lock(&mu_);
  const absl::Time now = deps_.clock->Now();
  for (v1::Job& record : saved) {
    auto spec = spec::ParseJobSpec(record.spec_yaml(), record.id());
    if (!spec.ok()) {
      problems.push_back(absl::StrCat(record.id(), ": its spec no longer parses (",
                                      spec.status().message(), "); not loaded"));
      continue;
    }
    Job& job = jobs_.emplace_back();
    job.id = record.id();
    next_job_ = std::max(next_job_, JobNumber(job.id) + 1);
    job.spec = *std::move(spec);
    job.spec_yaml = record.spec_yaml();
    job.created = rpc::FromProtoTimestamp(record.created_time());
    std::vector<v1::LayerInfo> layers(record.layers().begin(), record.layers().end());
    absl::StatusOr<Plan> plan = PlanJob(job.spec, layers);
    if (!plan.ok()) {
      // An Infer job's spec plans with the client's batch in place of its data.
      PlanOptions options;
      options.client_batches = true;
      absl::StatusOr<Plan> inference_plan = PlanJob(job.spec, layers, options);
      if (inference_plan.ok()) {
        plan = std::move(inference_plan);
        job.inference = true;
      }
    }
    const bool final_state = IsFinal(record.state());
    if (plan.ok()) {
      job.plan = *std::move(plan);
    } else {
      // Kept for display only (a final job), or failed below.
      job.plan.layers = layers;
      job.plan.num_stages = record.num_stages();
      job.plan.num_ranks = record.num_ranks();
      job.plan.schedule_name = record.schedule();
      job.plan.num_microbatches = record.microbatches();
    }
    job.state = record.state();
    job.reason = record.reason();
    for (const v1::JobTransition& t : record.history()) {
      job.history.push_back(t);
      v1::JobEvent event;
      *event.mutable_state_change() = t;
      job.AddEvent(std::move(event), rpc::FromProtoTimestamp(t.time()));
    }
    job.attempt = record.attempt();
    job.restarts = record.restarts();
    if (record.has_failure()) job.failure = record.failure();
    job.losses.assign(record.losses().begin(), record.losses().end());
    job.max_bubble_ratios.assign(record.max_bubble_ratios().begin(),
                                 record.max_bubble_ratios().end());
    if (record.has_resumed_from()) {
      job.resumed_from = record.resumed_from();
      job.base_step = record.resumed_from().step();
      if (!final_state) {
        auto m = VerifyCheckpoint(record.resumed_from().directory());
        if (m.ok()) {
          for (const ManifestStage& st : m->stages) job.resume_files.push_back(st.files);
        } else {
          problems.push_back(
              absl::StrCat(job.id, ": the checkpoint it resumed from: ", m.status().message()));
        }
      }
    }
    job.finish_step = job.base_step + record.steps_total();
    job.attempt_base = record.global_steps_done();
    if (record.state() == v1::JOB_STATE_PAUSED || record.pause_at_global_step() > 0) {
      job.hold_step = record.pause_at_global_step();
    }
    for (const v1::JobCheckpoint& c : record.checkpoints()) {
      if (final_state) {
        job.checkpoints.push_back(c);
        continue;
      }
      auto m = VerifyCheckpoint(c.directory());
      if (!m.ok()) {
        problems.push_back(absl::StrCat(job.id, ": checkpoint after step ", c.step(),
                                        " is unusable: ", m.status().message()));
        continue;
      }
      job.checkpoints.push_back(c);
      for (const ManifestStage& st : m->stages) {
        job.checkpoint_stage_files[c.step()].push_back(st.files);
      }
    }
    if (final_state) {
      for (const v1::RankStatus& r : record.ranks()) {
        RankSlot& slot = job.ranks.emplace_back();
        slot.rank = r.rank();
        slot.worker_id = r.worker_id();
        slot.stages.assign(r.stages().begin(), r.stages().end());
        slot.steps_done = r.steps_done();
        slot.bytes_sent = r.bytes_sent();
        slot.bytes_received = r.bytes_received();
        slot.parameters = r.parameters();
        slot.task_ended = true;
      }
      continue;
    }
    if (!plan.ok()) {
      EndJobLocked(&job, v1::JOB_STATE_FAILED,
                   absl::StrCat("cannot plan it again after the coordinator restarted: ",
                                plan.status().message()));
      continue;
    }
    if (job.inference) {
      EndJobLocked(&job, v1::JOB_STATE_FAILED,
                   "the coordinator restarted while the inference ran; its client's batch was "
                   "not kept");
      continue;
    }
    if (job.state == v1::JOB_STATE_PENDING) continue;
    // It was placed: it continues from its latest checkpoint on the workers that register.
    const std::string why = absl::StrCat(
        "the coordinator restarted; continuing from ",
        job.checkpoints.empty()
            ? std::string(job.resumed_from.has_value() ? "the checkpoint it resumed from"
                                                       : "its initial parameters")
            : absl::StrCat("the checkpoint after step ", job.checkpoints.back().step()),
        " once workers register");
    if (job.state == v1::JOB_STATE_RESTARTING) {
      job.reason = why;
    } else {
      absl::Status moved = job.TransitionTo(v1::JOB_STATE_RESTARTING, why, now);
      if (!moved.ok()) problems.push_back(absl::StrCat(job.id, ": ", moved.message()));
    }
    PersistLocked(job);
    spdlog::info("{} recovered: {}", job.id, why);
  }
  spdlog::info("job table: {} jobs loaded from {}", jobs_.size(), deps_.store->dir());
  ScheduleLocked();
  return problems;
}

// --- Failures and restarts ---

void JobManager::FailOrRestartLocked(Job* job, v1::JobFailure failure, const std::string& reason) {
  if (IsFinal(job->state) || job->state == v1::JOB_STATE_RESTARTING) return;
  *failure.mutable_time() = rpc::ToProtoTimestamp(deps_.clock->Now());
  job->failure = failure;
  const int max = job->spec.restart.max_restarts;
  if (job->inference || job->restarts >= max) {
    std::string why = reason;
    if (max > 0 && !job->inference) {
      absl::StrAppend(&why, " (no restart left: max_restarts ", max, " used)");
    }
    EndJobLocked(job, v1::JOB_STATE_FAILED, why);
    return;
  }
  ++job->restarts;
  if (deps_.metrics) deps_.metrics->JobRestarted();
  const std::string from =
      job->checkpoints.empty()
          ? (job->resumed_from.has_value() ? "the checkpoint it resumed from"
                                           : "its initial parameters (no checkpoint yet)")
          : absl::StrCat("the checkpoint after step ", job->checkpoints.back().step());
  RestartLocked(job,
                absl::StrCat(reason, "; restart ", job->restarts, " of ", max, " from ", from));
}

void JobManager::RestartLocked(Job* job, const std::string& why) {
  absl::Status moved = job->TransitionTo(v1::JOB_STATE_RESTARTING, why, deps_.clock->Now());
  if (!moved.ok()) {
    spdlog::error("{}: {}", job->id, moved.message());
    return;
  }
  spdlog::warn("{} RESTARTING: {}", job->id, why);
  deps_.kv->DeletePrefix(job->RendezvousPrefix());
  job->pausing = false;
  job->finishing = false;
  if (!job->starting) {
    for (const RankSlot& slot : job->ranks) {
      if (!slot.task_ended) StopRankLocked(*job, slot, why);
    }
  }
  PersistLocked(*job);
}

// --- Step control ---

void JobManager::ControlFailedLocked(Job* job, int rank, const absl::Status& error,
                                     const std::string& doing) {
  v1::JobFailure cause;
  cause.set_rank(rank);
  if (rank >= 0 && rank < static_cast<int>(job->ranks.size())) {
    cause.set_worker_id(job->ranks[rank].worker_id);
  }
  cause.set_error(absl::StrCat("ControlTask: ", error.message()));
  FailOrRestartLocked(job, cause, absl::StrCat(doing, ": ", error.message()));
  ScheduleLocked();
}

void JobManager::MaybePauseLocked(Job* job) {
  if (job->state != v1::JOB_STATE_RUNNING || job->pausing || job->hold_step < 0 ||
      job->global_done() < job->hold_step) {
    return;
  }
  absl::Status moved = job->TransitionTo(v1::JOB_STATE_PAUSED,
                                         absl::StrCat("holding after global step ", job->hold_step),
                                         deps_.clock->Now());
  if (!moved.ok()) spdlog::error("{}: {}", job->id, moved.message());
  PersistLocked(*job);
}

void JobManager::MaybeFinishLocked(Job* job) {
  if (job->state != v1::JOB_STATE_RUNNING || job->pausing || job->finishing ||
      job->global_done() != job->finish_step ||
      (job->hold_step >= 0 && job->hold_step <= job->finish_step)) {
    return;
  }
  job->finishing = true;
  std::vector<v1::ControlTaskRequest> requests(job->ranks.size(),
                                               ControlRequest(*job, job->finish_step));
  for (auto& r : requests) r.set_finish_at_limit(true);
  SendControlLocked(job, std::move(requests));
}

v1::ControlTaskRequest JobManager::ControlRequest(const Job& job, int64_t step_limit) const {
  v1::ControlTaskRequest request;
  request.set_job_id(job.id);
  request.set_attempt(job.attempt);
  request.set_step_limit(step_limit);
  return request;
}

void JobManager::SendControlLocked(Job* job, std::vector<v1::ControlTaskRequest> requests) {
  for (size_t r = 0; r < requests.size() && r < job->ranks.size(); ++r) {
    const RankSlot& slot = job->ranks[r];
    calls_->Enqueue([this, job_id = job->id, attempt = job->attempt, rank = slot.rank,
                     worker_id = slot.worker_id, address = slot.worker_address,
                     request = std::move(requests[r])] {
      auto answered = deps_.workers->ControlTask(address, request, options_.worker_rpc_timeout);
      if (answered.ok()) return;
      absl::MutexLock lock(&mu_);
      Job* job = FindJob(job_id);
      if (job == nullptr || job->attempt != attempt || IsFinal(job->state)) return;
      v1::JobFailure failure;
      failure.set_rank(rank);
      failure.set_worker_id(worker_id);
      failure.set_error(absl::StrCat("ControlTask: ", answered.status().message()));
      FailOrRestartLocked(job, failure,
                          absl::StrCat("rank ", rank, " (worker ", worker_id,
                                       ") could not be steered: ", answered.status().message()));
      ScheduleLocked();
    });
  }
}

absl::Status JobManager::CallControl(const std::vector<std::pair<int, std::string>>& ranks,
                                     const std::vector<v1::ControlTaskRequest>& requests,
                                     int* failed_rank) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    auto answered =
        deps_.workers->ControlTask(ranks[i].second, requests[i], options_.worker_rpc_timeout);
    if (!answered.ok()) {
      *failed_rank = ranks[i].first;
      return absl::Status(answered.status().code(),
                          absl::StrCat("rank ", ranks[i].first, ": ", answered.status().message()));
    }
  }
  return absl::OkStatus();
}

namespace {

// The ranks of a job's current attempt: (rank, worker address).
std::vector<std::pair<int, std::string>> RankAddresses(const Job& job) {
  std::vector<std::pair<int, std::string>> out;
  for (const RankSlot& slot : job.ranks) out.emplace_back(slot.rank, slot.worker_address);
  return out;
}

absl::Status NotInState(const Job& job, absl::string_view what, absl::string_view needed) {
  return absl::FailedPreconditionError(absl::StrCat("job ", job.id, " is ", JobStateName(job.state),
                                                    "; ", what, " needs a ", needed, " job"));
}

}  // namespace

absl::StatusOr<v1::PauseJobResponse> JobManager::PauseJob(const std::string& job_id) {
  absl::MutexLock control(&control_mu_);
  std::vector<std::pair<int, std::string>> ranks;
  int attempt = 0;
  int64_t boundary = 0, finish = 0;
  v1::PauseJobResponse response;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
    if (job->state == v1::JOB_STATE_PAUSED ||
        (job->state == v1::JOB_STATE_RUNNING && job->hold_step >= 0)) {
      response.set_global_step(job->hold_step);
      job->ToProto(response.mutable_job());
      return response;
    }
    if (job->state != v1::JOB_STATE_RUNNING) return NotInState(*job, "pausing", "RUNNING");
    if (job->finishing) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " has done all its steps and is finishing"));
    }
    int64_t furthest = 0;
    for (const RankSlot& slot : job->ranks) furthest = std::max(furthest, slot.steps_done);
    // The earliest boundary no rank has passed: ranks at `furthest` are inside the next step.
    finish = job->finish_step;
    boundary = std::min(job->attempt_base + furthest + 1, finish);
    if (job->global_done() == finish) boundary = finish;
    job->pausing = true;
    ranks = RankAddresses(*job);
    attempt = job->attempt;
  }
  constexpr int kTries = 5;
  absl::Status failure;
  int failed_rank = -1;
  for (int tried = 0; tried < kTries; ++tried) {
    std::vector<v1::ControlTaskRequest> requests;
    for (size_t i = 0; i < ranks.size(); ++i) {
      v1::ControlTaskRequest request;
      request.set_job_id(job_id);
      request.set_attempt(attempt);
      request.set_step_limit(boundary);
      requests.push_back(request);
    }
    failure = CallControl(ranks, requests, &failed_rank);
    // A rank already inside the step after `boundary` refuses it: pause one step later.
    if (failure.ok() || !absl::IsFailedPrecondition(failure) || boundary >= finish) break;
    ++boundary;
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  job->pausing = false;
  if (job->attempt != attempt || job->state != v1::JOB_STATE_RUNNING) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " became ", JobStateName(job->state),
                                           " while it was being paused: ", job->reason));
  }
  if (!failure.ok()) {
    if (absl::IsFailedPrecondition(failure)) {
      // Ranks that took a lower limit run on to the end again.
      SendControlLocked(job, std::vector<v1::ControlTaskRequest>(
                                 job->ranks.size(), ControlRequest(*job, job->finish_step)));
      MaybeFinishLocked(job);
      return absl::AbortedError(
          absl::StrCat("job ", job_id, ": no step boundary to pause at (", failure.message(), ")"));
    }
    ControlFailedLocked(job, failed_rank, failure, absl::StrCat("pausing ", job_id));
    return failure;
  }
  job->hold_step = boundary;
  spdlog::info("{}: pausing after global step {}", job_id, boundary);
  MaybePauseLocked(job);
  PersistLocked(*job);
  response.set_global_step(boundary);
  job->ToProto(response.mutable_job());
  return response;
}

absl::StatusOr<v1::Job> JobManager::ResumeJob(const std::string& job_id) {
  absl::MutexLock control(&control_mu_);
  std::vector<std::pair<int, std::string>> ranks;
  std::vector<v1::ControlTaskRequest> requests;
  int attempt = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
    if (job->state != v1::JOB_STATE_PAUSED) return NotInState(*job, "resuming", "PAUSED");
    ranks = RankAddresses(*job);
    attempt = job->attempt;
    requests.assign(ranks.size(), ControlRequest(*job, job->finish_step));
  }
  int failed_rank = -1;
  const absl::Status sent = CallControl(ranks, requests, &failed_rank);
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  if (job->attempt != attempt || job->state != v1::JOB_STATE_PAUSED) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " became ", JobStateName(job->state),
                                           " while it was being resumed: ", job->reason));
  }
  if (!sent.ok()) {
    ControlFailedLocked(job, failed_rank, sent, absl::StrCat("resuming ", job_id));
    return sent;
  }
  job->hold_step = -1;
  absl::Status moved =
      job->TransitionTo(v1::JOB_STATE_RUNNING, "resumed by client", deps_.clock->Now());
  if (!moved.ok()) return moved;
  PersistLocked(*job);
  MaybeFinishLocked(job);
  v1::Job out;
  job->ToProto(&out);
  return out;
}

absl::StatusOr<v1::RunStepsResponse> JobManager::RunSteps(const std::string& job_id,
                                                          int64_t steps) {
  if (steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("steps: must be >= 1, got ", steps));
  }
  absl::MutexLock control(&control_mu_);
  std::vector<std::pair<int, std::string>> ranks;
  std::vector<v1::ControlTaskRequest> requests;
  int attempt = 0;
  int64_t until = 0;
  bool was_paused = false;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
    if (job->state == v1::JOB_STATE_PAUSED) {
      was_paused = true;
      until = job->global_done() + steps;
      job->hold_step = until;
    } else if (job->state == v1::JOB_STATE_RUNNING) {
      if (job->finishing) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_id,
                         " has done all its steps and is finishing; to train on, submit a "
                         "job with training.resume_from its final checkpoint"));
      }
      if (job->pausing) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_id, " is being paused; retry once it is PAUSED"));
      }
      until = job->hold_step >= 0 ? job->hold_step : job->finish_step + steps;
    } else {
      return NotInState(*job, "running more steps", "RUNNING or PAUSED");
    }
    // The job's end moves when the new steps go past it, and with it its final checkpoint.
    const int64_t new_finish =
        was_paused ? std::max(job->finish_step, until) : job->finish_step + steps;
    const bool extended = new_finish != job->finish_step;
    job->finish_step = new_finish;
    ranks = RankAddresses(*job);
    attempt = job->attempt;
    v1::ControlTaskRequest request =
        ControlRequest(*job, job->hold_step >= 0 ? job->hold_step : job->finish_step);
    if (extended && !job->forward_only() && !job->spec.training.checkpoint.dir.empty()) {
      request.add_checkpoint_steps(job->finish_step);
    }
    requests.assign(ranks.size(), request);
    PersistLocked(*job);
  }
  int failed_rank = -1;
  const absl::Status sent = CallControl(ranks, requests, &failed_rank);
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  if (job->attempt != attempt || IsFinal(job->state) || job->state == v1::JOB_STATE_RESTARTING) {
    return absl::AbortedError(
        absl::StrCat("job ", job_id, " became ", JobStateName(job->state), ": ", job->reason));
  }
  if (!sent.ok()) {
    ControlFailedLocked(job, failed_rank, sent, absl::StrCat("running ", job_id));
    return sent;
  }
  if (was_paused) {
    absl::Status moved = job->TransitionTo(
        v1::JOB_STATE_RUNNING,
        absl::StrCat("running ", steps, " more steps (until global step ", until, ")"),
        deps_.clock->Now());
    if (!moved.ok()) return moved;
  }
  MaybePauseLocked(job);
  MaybeFinishLocked(job);
  PersistLocked(*job);
  v1::RunStepsResponse response;
  response.set_until_global_step(until);
  job->ToProto(response.mutable_job());
  return response;
}

absl::StatusOr<v1::StepJobResponse> JobManager::StepJob(const v1::StepJobRequest& request,
                                                        absl::Duration timeout,
                                                        const std::function<bool()>& caller_gone) {
  const std::string& job_id = request.job_id();
  const bool forward_only = request.forward_only();
  absl::MutexLock control(&control_mu_);
  std::vector<std::pair<int, std::string>> ranks;
  std::vector<v1::ControlTaskRequest> requests;
  int attempt = 0;
  int64_t global = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
    if (job->state != v1::JOB_STATE_PAUSED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " is ", JobStateName(job->state),
          "; a client batch step needs a PAUSED job (pause it first, or submit it paused)"));
    }
    RETURN_IF_ERROR(rpc::ValidateTensorData(request.inputs(), "inputs"));
    const v1::TensorData& inputs = request.inputs();
    const int m = job->plan.num_microbatches;
    if (inputs.shape_size() < 1 || inputs.shape(0) < m) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs: needs at least as many rows (dim 0) as the job's ", m,
                       " microbatches, got ", rpc::DescribeTensorData(inputs)));
    }
    if (!forward_only) {
      if (job->forward_only()) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward_only: job ", job_id, "'s schedule ", job->plan.schedule_name,
                         " has no backward, so only forward-only client steps run on it"));
      }
      if (!request.has_targets()) {
        return absl::InvalidArgumentError(
            "targets: required for a training step (or set forward_only for inference)");
      }
      RETURN_IF_ERROR(rpc::ValidateTensorData(request.targets(), "targets"));
      if (request.targets().shape_size() < 1 || request.targets().shape(0) != inputs.shape(0)) {
        return absl::InvalidArgumentError(absl::StrCat("targets: needs one row per input row (",
                                                       inputs.shape(0), "), got ",
                                                       rpc::DescribeTensorData(request.targets())));
      }
    }
    global = job->global_done();
    Job::ClientStepState state;
    state.global_step = global;
    state.forward_only = forward_only;
    state.rows = inputs.shape(0);
    job->client_step = state;
    if (!forward_only) job->hold_step = global + 1;
    ranks = RankAddresses(*job);
    attempt = job->attempt;
    const int first_rank = job->plan.stage_to_rank[0];
    const int last_rank = job->plan.stage_to_rank[job->plan.num_stages - 1];
    for (const auto& [rank, address] : ranks) {
      v1::ControlTaskRequest r = ControlRequest(*job, forward_only ? global : global + 1);
      v1::ClientStep* cs = r.mutable_client_step();
      cs->set_global_step(global);
      cs->set_forward_only(forward_only);
      for (int64_t d : inputs.shape()) cs->add_inputs_shape(d);
      cs->set_inputs_dtype(inputs.dtype());
      if (rank == first_rank) *cs->mutable_inputs() = inputs;
      if (rank == last_rank && !forward_only) *cs->mutable_targets() = request.targets();
      requests.push_back(std::move(r));
    }
  }
  int failed_rank = -1;
  const absl::Status sent = CallControl(ranks, requests, &failed_rank);
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  if (job->attempt != attempt || job->state != v1::JOB_STATE_PAUSED) {
    job->client_step.reset();
    return absl::AbortedError(absl::StrCat("job ", job_id, " became ", JobStateName(job->state),
                                           " while the client step was sent: ", job->reason));
  }
  if (!sent.ok()) {
    job->client_step.reset();
    if (!forward_only) job->hold_step = global;
    if (absl::IsInvalidArgument(sent) || absl::IsFailedPrecondition(sent)) {
      // A rank refused the batch before any ran it (ranks before it hold the request; they
      // cannot have started, since the step needs every rank): the job stays PAUSED. The
      // others are told to keep holding where they are.
      SendControlLocked(job, std::vector<v1::ControlTaskRequest>(job->ranks.size(),
                                                                 ControlRequest(*job, global)));
      return sent;
    }
    ControlFailedLocked(job, failed_rank, sent, absl::StrCat("client step of ", job_id));
    return sent;
  }
  if (!forward_only) {
    absl::Status moved = job->TransitionTo(
        v1::JOB_STATE_RUNNING, absl::StrCat("client batch step at global step ", global),
        deps_.clock->Now());
    if (!moved.ok()) return moved;
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || job->attempt != attempt || IsFinal(job->state) ||
           job->state == v1::JOB_STATE_RESTARTING ||
           (job->client_step.has_value() && job->client_step->done &&
            job->state == v1::JOB_STATE_PAUSED);
  };
  while (!settled()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job ", job_id, ": the client step at global step ", global, " did not finish within ",
          absl::FormatDuration(timeout), " (the job keeps running it)"));
    }
    if (caller_gone && caller_gone()) {
      return absl::CancelledError(
          absl::StrCat("job ", job_id, ": the caller of StepJob went away"));
    }
    mu_.AwaitWithTimeout(absl::Condition(&settled), std::min(left, kInferPoll));
  }
  if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
  if (!(job->client_step.has_value() && job->client_step->done) || job->attempt != attempt) {
    job->client_step.reset();
    return absl::AbortedError(absl::StrCat("job ", job_id, " became ", JobStateName(job->state),
                                           " during the client step: ", job->reason));
  }
  Job::ClientStepState done = *std::move(job->client_step);
  job->client_step.reset();
  v1::StepJobResponse response;
  response.set_global_step(global);
  *response.mutable_step_time() = rpc::ToProtoDuration(done.slowest);
  if (forward_only) {
    if (!done.outputs.has_value()) {
      return absl::InternalError(absl::StrCat("job ", job_id, ": no outputs came back"));
    }
    *response.mutable_outputs() = *std::move(done.outputs);
  } else {
    for (double l : done.losses) response.add_microbatch_losses(l);
    if (!done.losses.empty()) {
      response.set_loss(std::accumulate(done.losses.begin(), done.losses.end(), 0.0) /
                        static_cast<double>(done.losses.size()));
    }
  }
  return response;
}

absl::StatusOr<v1::CheckpointJobResponse> JobManager::CheckpointPausedJob(
    const std::string& job_id) {
  absl::MutexLock control(&control_mu_);
  std::vector<std::pair<int, std::string>> ranks;
  std::vector<v1::ControlTaskRequest> requests;
  v1::CheckpointJobResponse response;
  int attempt = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
    if (job->state != v1::JOB_STATE_PAUSED) return NotInState(*job, "checkpointing", "PAUSED");
    if (job->forward_only() || job->spec.training.checkpoint.dir.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id,
                       job->forward_only() ? " is forward-only; it has no training state to save"
                                           : ": its spec has no training.checkpoint.dir"));
    }
    const int64_t step = job->global_done();
    response.set_step(step);
    response.set_directory(CheckpointStepDirectory(job->spec.training.checkpoint.dir, step));
    for (const v1::JobCheckpoint& c : job->checkpoints) {
      if (c.step() == step) return response;  // already written there
    }
    // The ranks stay where they hold and write the checkpoint of that position.
    v1::ControlTaskRequest request = ControlRequest(*job, job->hold_step);
    request.add_checkpoint_steps(step);
    ranks = RankAddresses(*job);
    requests.assign(ranks.size(), request);
    attempt = job->attempt;
  }
  int failed_rank = -1;
  const absl::Status sent = CallControl(ranks, requests, &failed_rank);
  if (!sent.ok()) {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job != nullptr && job->attempt == attempt && !IsFinal(job->state) &&
        !absl::IsFailedPrecondition(sent)) {
      ControlFailedLocked(job, failed_rank, sent, absl::StrCat("checkpointing ", job_id));
    }
    return sent;
  }
  spdlog::info("{}: checkpoint of the paused job at step {} requested in {}", job_id,
               response.step(), response.directory());
  return response;
}

absl::StatusOr<v1::GetJobScheduleResponse> JobManager::GetJobSchedule(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  return ScheduleView(job->plan);
}

absl::StatusOr<v1::GetStepTraceResponse> JobManager::GetStepTrace(const std::string& job_id,
                                                                  int64_t global_step) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, FindJobOrError(job_id));
  v1::GetStepTraceResponse response;
  int64_t traced = -1;
  ASSIGN_OR_RETURN(
      std::string trace,
      job->traces.Trace(global_step, job->plan.num_ranks,
                        absl::StrCat(job->id, " (", job->plan.schedule_name, ")"), &traced));
  response.set_global_step(traced);
  response.set_trace_json(std::move(trace));
  response.set_first_kept_step(job->traces.first_kept());
  response.set_last_kept_step(job->traces.last_kept());
  return response;
}

}  // namespace stagecoach::coordinator
