#include "worker/runtime/task_runner.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"
#include "common/schedule/action.h"
#include "common/spec/spec_parser.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "worker/model/gpt.h"
#include "worker/model/mlp.h"
#include "worker/model/torchscript_model.h"
#include "worker/runtime/checkpoint.h"
#include "worker/runtime/device.h"
#include "worker/runtime/forward_actions.h"
#include "worker/runtime/pipeline_executor.h"
#include "worker/runtime/tensor_data.h"
#include "worker/runtime/training_data.h"
#include "worker/runtime/training_setup.h"

namespace stagecoach::runtime {
namespace {

// Stage 0's microbatches of an Infer job: the client's batch, split along dim 0, each checked
// by running stage 0 on it (once per distinct shape). Floating-point inputs are converted to the
// model's dtype (float32). Called before the data plane is set up, so that a batch that does not
// fit fails on this rank, as the root cause, rather than as a broken connection on its peers.
absl::StatusOr<std::vector<torch::Tensor>> InferenceMicrobatches(const v1::TensorData& inputs,
                                                                 int microbatches,
                                                                 model::StageModel& stage0) {
  ASSIGN_OR_RETURN(torch::Tensor x, FromTensorData(inputs, "inference.inputs"));
  if (x.dim() < 1 || x.size(0) < microbatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference.inputs: ", rpc::DescribeTensorData(inputs), " has fewer rows than ",
                     microbatches, " microbatches"));
  }
  if (x.is_floating_point()) x = x.to(torch::kFloat32);
  std::vector<torch::Tensor> out = SplitMicrobatches(x, microbatches);
  const std::vector<torch::Tensor> params = stage0.Parameters();
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params[0].device();
  torch::NoGradGuard no_grad;
  for (size_t mb = 0; mb < out.size(); ++mb) {
    if (mb > 0 && out[mb].sizes() == out[mb - 1].sizes()) continue;
    try {
      stage0.ForwardValues({out[mb].to(device)});
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("inference.inputs: stage 0 cannot take microbatch ", mb, " of shape [",
                       absl::StrJoin(out[mb].sizes(), ", "), "]: ", e.what_without_backtrace()));
    }
  }
  return out;
}

// The shapes and dtypes of stage 0's microbatches, for PipelineExecutor::AgreeShapes (empty on
// the ranks that do not own stage 0, which pass no microbatches).
std::vector<TensorMeta> MetasOf(const std::vector<torch::Tensor>& microbatches) {
  std::vector<TensorMeta> out;
  for (const auto& mb : microbatches) out.push_back(TensorMeta{mb.sizes().vec(), mb.scalar_type()});
  return out;
}

// "[2, 3]".
std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

// A client step as the gate runs it: the request's step, its tensors decoded, converted and split
// into microbatches.
struct TaskRunner::ClientBatch {
  // The timeline step it runs at (the task holds at exactly this many steps).
  int64_t global_step = 0;
  bool forward_only = false;
  // Stage 0's microbatches (only on the rank owning stage 0).
  std::vector<torch::Tensor> inputs;
  // The last stage's target microbatches (only on its rank, training client steps).
  std::vector<torch::Tensor> targets;
};

// Decorates the task's rendezvous store so that Stop can interrupt its waits: long waits are
// cut into short slices, and a cancelled store answers CANCELLED.
class TaskRunner::CancellableStore : public transport::RendezvousStore {
 public:
  static constexpr absl::Duration kSlice = absl::Milliseconds(250);

  explicit CancellableStore(transport::RendezvousStore* inner) : inner_(inner) {}

  void Cancel() { cancelled_.store(true); }

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (cancelled_.load()) return Cancelled();
    return inner_->Set(key, value);
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (cancelled_.load()) return Cancelled();
      const absl::Duration slice =
          std::min(kSlice, std::max(deadline - absl::Now(), absl::ZeroDuration()));
      auto value = inner_->Get(key, slice);
      if (value.ok() || !absl::IsDeadlineExceeded(value.status()) || absl::Now() >= deadline) {
        return value;
      }
    }
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (cancelled_.load()) return Cancelled();
      const absl::Duration slice =
          std::min(kSlice, std::max(deadline - absl::Now(), absl::ZeroDuration()));
      absl::Status waited = inner_->Wait(keys, slice);
      if (waited.ok() || !absl::IsDeadlineExceeded(waited) || absl::Now() >= deadline) {
        return waited;
      }
    }
  }

 private:
  static absl::Status Cancelled() {
    return absl::CancelledError("rendezvous interrupted: the task is stopping");
  }

  transport::RendezvousStore* inner_;
  std::atomic<bool> cancelled_{false};
};

TaskRunner::TaskRunner(v1::TaskAssignment task, TaskRunnerDeps deps)
    : task_(std::move(task)),
      deps_(std::move(deps)),
      store_(std::make_unique<CancellableStore>(deps_.store)) {
  absl::MutexLock lock(&mu_);
  global_steps_done_ = task_.has_resume() ? task_.resume().step() : 0;
  step_limit_ = task_.step_limit();
  finish_at_limit_ = task_.finish_at_limit();
  if (task_.has_inference()) {
    // An Infer job runs its one step and ends, whatever the assignment's limit.
    step_limit_ = global_steps_done_ + 1;
    finish_at_limit_ = true;
  }
  checkpoint_steps_.insert(task_.checkpoint_steps().begin(), task_.checkpoint_steps().end());
}

TaskRunner::~TaskRunner() = default;

void TaskRunner::Stop(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!stop_requested_) {
    stop_requested_ = true;
    stop_reason_ = reason;
  }
  store_->Cancel();
  if (transport_ != nullptr) transport_->Abort();
}

absl::Status TaskRunner::RequestCheckpoint(int64_t global_step) {
  absl::MutexLock lock(&mu_);
  if (global_steps_done_ >= 0 && global_step <= global_steps_done_) {
    return absl::FailedPreconditionError(absl::StrCat(
        task_.job_id(), " rank ", task_.rank(), ": the task has already done ", global_steps_done_,
        " steps of the timeline; it cannot checkpoint after step ", global_step));
  }
  checkpoint_steps_.insert(global_step);
  return absl::OkStatus();
}

absl::StatusOr<v1::ControlTaskResponse> TaskRunner::ControlTask(
    const v1::ControlTaskRequest& request) {
  const int rank = task_.rank();
  const std::string who =
      absl::StrCat(task_.job_id(), " attempt ", task_.attempt(), " rank ", rank);
  if (request.job_id() != task_.job_id() || request.attempt() != task_.attempt()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this task is ", who, ", not ", request.job_id(), " attempt ", request.attempt()));
  }
  if (task_.has_inference()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": an Infer job's task runs its one step and takes no ControlTask"));
  }
  const bool forward_only_task = task_.forward_only();
  // A client step's batch, checked and split before the lock is taken.
  std::unique_ptr<ClientBatch> client;
  if (request.has_client_step()) {
    const v1::ClientStep& cs = request.client_step();
    const int64_t g = cs.global_step();
    if (g < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("client_step.global_step: must be >= 0, got ", g));
    }
    const int64_t want_limit = cs.forward_only() ? g : g + 1;
    if (request.step_limit() != want_limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step_limit: a ", cs.forward_only() ? "forward-only" : "training",
          " client step needs step_limit = client_step.global_step",
          cs.forward_only() ? "" : " + 1", " (", want_limit, "), got ", request.step_limit()));
    }
    auto spec = spec::ParseJobSpec(task_.spec_yaml(), task_.job_id());
    if (!spec.ok()) return spec.status();
    const int m = spec->schedule.microbatches;
    bool owns_first = false, owns_last = false;
    for (const v1::StageAssignment& st : task_.stages()) {
      owns_first = owns_first || st.stage() == 0;
      owns_last = owns_last || st.stage() == task_.num_stages() - 1;
    }
    if (cs.inputs_shape().empty()) {
      return absl::InvalidArgumentError("client_step.inputs_shape: required");
    }
    const int64_t rows = cs.inputs_shape(0);
    if (rows < m) {
      return absl::InvalidArgumentError(
          absl::StrCat("client_step.inputs_shape: ", ShapeString(cs.inputs_shape()), " has ", rows,
                       " rows, fewer than the job's ", m, " microbatches"));
    }
    client = std::make_unique<ClientBatch>();
    client->global_step = g;
    client->forward_only = cs.forward_only();
    if (owns_first != cs.has_inputs()) {
      return absl::InvalidArgumentError(
          owns_first
              ? absl::StrCat("client_step.inputs: required on rank ", rank, ", which owns stage 0")
              : absl::StrCat("client_step.inputs: only for the rank owning stage 0, not ", "rank ",
                             rank));
    }
    if (owns_first) {
      ASSIGN_OR_RETURN(torch::Tensor x, FromTensorData(cs.inputs(), "client_step.inputs"));
      if (x.sizes().vec() !=
          std::vector<int64_t>(cs.inputs_shape().begin(), cs.inputs_shape().end())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "client_step.inputs: ", rpc::DescribeTensorData(cs.inputs()),
            " does not have client_step.inputs_shape ", ShapeString(cs.inputs_shape())));
      }
      if (x.is_floating_point()) x = x.to(torch::kFloat32);
      client->inputs = SplitMicrobatches(x, m);
    }
    const bool wants_targets = owns_last && !cs.forward_only();
    if (wants_targets != cs.has_targets()) {
      return absl::InvalidArgumentError(
          wants_targets
              ? absl::StrCat("client_step.targets: required on rank ", rank,
                             ", which owns the last stage, for a training client step")
              : absl::StrCat("client_step.targets: only for the rank owning the last stage of a ",
                             "training client step, not rank ", rank));
    }
    if (wants_targets) {
      ASSIGN_OR_RETURN(torch::Tensor y, FromTensorData(cs.targets(), "client_step.targets"));
      if (y.dim() < 1 || y.size(0) != rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("client_step.targets: ", rpc::DescribeTensorData(cs.targets()),
                         " must have one row per input row (", rows, ")"));
      }
      if (y.is_floating_point()) y = y.to(torch::kFloat32);
      client->targets = SplitMicrobatches(y, m);
    }
  }

  absl::MutexLock lock(&mu_);
  const int64_t done = global_steps_done_;
  if (finishing_ || stop_requested_) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": the task is ending (after ", done,
                                                      " steps of the timeline) and takes no "
                                                      "ControlTask"));
  }
  const int64_t least = executing_ ? done + 1 : done;
  if (request.step_limit() < least) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": step_limit ", request.step_limit(), " is below the ", least, " steps ",
        executing_ ? absl::StrCat("the task will have done at the end of the step it runs (", done,
                                  " done)")
                   : "the task has done"));
  }
  if (client != nullptr) {
    if (pending_client_ != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": a client step at step ", pending_client_->global_step, " is already pending"));
    }
    const bool holding = !executing_ && done >= step_limit_ && !finish_at_limit_;
    if (!holding || done != client->global_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": client_step.global_step is ", client->global_step, ", but the task ",
          holding ? absl::StrCat("holds at step ", done)
                  : absl::StrCat("does not hold (", done, " steps done, step limit ", step_limit_,
                                 executing_ ? ", a step running" : "", ")")));
    }
    if (!client->forward_only && forward_only_task) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, ": a forward-only task cannot run a training client step"));
    }  // A batch stage 0 cannot take is refused here, while every rank still holds, rather than
    // failing the job in the middle of the step.
    if (stage0_ != nullptr) {
      auto checked = InferenceMicrobatches(request.client_step().inputs(),
                                           static_cast<int>(client->inputs.size()), *stage0_);
      if (!checked.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("client_step.inputs (rank ", rank, "): ", checked.status().message()));
      }
    }
  }
  step_limit_ = request.step_limit();
  finish_at_limit_ = request.finish_at_limit();
  for (int64_t step : request.checkpoint_steps()) {
    if (step > done) checkpoint_steps_.insert(step);
    if (step == done && !executing_) checkpoint_at_hold_ = true;
  }
  pending_client_ = std::move(client);
  ++control_version_;
  v1::ControlTaskResponse response;
  response.set_global_steps_done(done);
  return response;
}

absl::Status TaskRunner::HoldLocked() {
  const int64_t version = control_version_;
  absl::Duration limit = rpc::FromProtoDuration(task_.hold_timeout());
  if (limit <= absl::ZeroDuration()) limit = absl::Hours(24);
  spdlog::info("{} rank {}: holding at step {} (step limit {})", task_.job_id(), task_.rank(),
               global_steps_done_, step_limit_);
  auto moved = [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_requested_ || control_version_ != version;
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&moved), limit)) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "rank ", task_.rank(), " held at step ", global_steps_done_,
      " for longer than hold_timeout (", absl::FormatDuration(limit), ") without a ControlTask"));
}

v1::ReportTaskEndRequest TaskRunner::Run() {
  absl::Status status;
  try {
    status = RunSteps();
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("rank ", task_.rank(), ": ", e.what()));
  }
  v1::ReportTaskEndRequest end;
  end.set_worker_id(deps_.worker_id);
  end.set_job_id(task_.job_id());
  end.set_attempt(task_.attempt());
  end.set_rank(task_.rank());
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      end.set_outcome(v1::TASK_OUTCOME_SUCCEEDED);
      if (inference_outputs_.has_value()) {
        *end.mutable_inference_outputs() = *std::move(inference_outputs_);
      }
    } else if (stop_requested_) {
      end.set_outcome(v1::TASK_OUTCOME_STOPPED);
      end.set_error(absl::StrCat("stopped: ", stop_reason_));
    } else {
      end.set_outcome(v1::TASK_OUTCOME_FAILED);
      end.set_error(std::string(status.message()));
    }
  }
  if (end.outcome() == v1::TASK_OUTCOME_FAILED) {
    spdlog::error("{} rank {} failed: {}", task_.job_id(), task_.rank(), end.error());
  } else {
    spdlog::info("{} rank {} ended: {}", task_.job_id(), task_.rank(),
                 v1::TaskOutcome_Name(end.outcome()));
  }
  return end;
}

absl::Status TaskRunner::RunSteps() {
  ASSIGN_OR_RETURN(spec::JobSpec spec, spec::ParseJobSpec(task_.spec_yaml(), task_.job_id()));
  ASSIGN_OR_RETURN(LossKind loss, ParseLoss(spec.training.loss));
  const int rank = task_.rank();
  const int num_stages = task_.num_stages();
  const int m = spec.schedule.microbatches;
  const bool forward_only = task_.forward_only() || task_.has_inference();
  const bool inference = task_.has_inference();
  if (task_.stage_to_rank_size() != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage_to_rank: expected ", num_stages,
                                                   " entries, got ", task_.stage_to_rank_size()));
  }

  // Where the stages run.
  torch::Device device = torch::kCPU;
  if (spec.placement.device == "cuda") {
    if (CudaIndex(deps_.device) < 0) {
      return absl::FailedPreconditionError(absl::StrCat("placement.device: cuda, but worker ",
                                                        deps_.worker_id, " runs on ", deps_.device,
                                                        " (start it with --device cuda)"));
    }
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(CudaIndex(deps_.device)));
  }

  // Files the spec names: an uploaded artifact is fetched from the coordinator.
  auto resolve = [&](const std::string& field,
                     const std::string& ref) -> absl::StatusOr<std::string> {
    if (!deps_.resolve_file) return ref;
    auto path = deps_.resolve_file(ref);
    if (!path.ok()) {
      return absl::Status(path.status().code(), absl::StrCat(field, ": ", path.status().message()));
    }
    return path;
  };
  if (!inference && !spec.data.path.empty()) {
    ASSIGN_OR_RETURN(spec.data.path, resolve("data.path", spec.data.path));
  }

  // The rank's stages of the model, and how values flow between all stages.
  for (const v1::StageAssignment& st : task_.stages()) {
    if (st.stage() < 0 || st.stage() >= num_stages || task_.stage_to_rank(st.stage()) != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("stages: stage ", st.stage(), " is not assigned to rank ", rank));
    }
  }
  if (task_.stages().empty()) return absl::InvalidArgumentError("stages: the task has no stage");
  std::unique_ptr<model::TorchScriptModel> script;  // outlives the stages cut from it
  std::vector<std::unique_ptr<model::StageModel>> owned;
  std::map<int, model::StageModel*> stages;
  model::PipelineWiring wiring = model::ChainWiring(num_stages);
  if (spec.model.torchscript.has_value()) {
    ASSIGN_OR_RETURN(const std::string path, resolve("model.torchscript", *spec.model.torchscript));
    ASSIGN_OR_RETURN(script, model::TorchScriptModel::Load(path));
    std::vector<std::string> names;
    for (const model::ModelLayer& layer : script->layers()) names.push_back(layer.name);
    const std::vector<std::string> planned(task_.layer_names().begin(), task_.layer_names().end());
    if (!planned.empty() && planned != names) {
      return absl::FailedPreconditionError(
          absl::StrCat("model.torchscript: '", *spec.model.torchscript, "' has the layers [",
                       absl::StrJoin(names, ", "), "], but the job was planned with [",
                       absl::StrJoin(planned, ", "), "] (was the file replaced?)"));
    }
    std::vector<int> firsts(task_.stage_first_layers().begin(), task_.stage_first_layers().end());
    if (firsts.empty() && num_stages == 1) firsts = {0};
    if (static_cast<int>(firsts.size()) != num_stages) {
      return absl::InvalidArgumentError(absl::StrCat("stage_first_layers: expected ", num_stages,
                                                     " entries, got ", firsts.size()));
    }
    ASSIGN_OR_RETURN(wiring, script->Split(firsts));
    std::vector<int> mine;
    for (const v1::StageAssignment& st : task_.stages()) mine.push_back(st.stage());
    RETURN_IF_ERROR(script->KeepOnlyStages(mine));
    for (int s : mine) {
      ASSIGN_OR_RETURN(auto stage, script->Stage(s));
      stages[s] = stage.get();
      owned.push_back(std::move(stage));
    }
  } else if (spec.model.builtin.has_value() &&
             (spec.model.builtin->family == "mlp" || spec.model.builtin->family == "gpt")) {
    for (const v1::StageAssignment& st : task_.stages()) {
      ASSIGN_OR_RETURN(
          auto stage,
          spec.model.builtin->family == "gpt"
              ? model::BuildGptStage(*spec.model.builtin, st.first_layer(), st.end_layer())
              : model::BuildMlpStage(*spec.model.builtin, st.first_layer(), st.end_layer()));
      stages[st.stage()] = stage.get();
      owned.push_back(std::move(stage));
    }
  } else {
    return absl::InvalidArgumentError(
        "model: this worker runs TorchScript models and the built-in mlp and gpt families");
  }
  std::vector<torch::Tensor> parameters;
  int64_t held_parameters = 0;
  for (auto& [s, stage] : stages) {
    stage->To(device);
    for (auto& p : stage->Parameters()) parameters.push_back(p);
    held_parameters += stage->ParameterCount();
  }
  if (script != nullptr) held_parameters = script->HeldParameterCount();
  // Skip connections: value pairs between stages that are not neighbours.
  std::vector<SkipPair> skips;
  for (int c = 0; c < num_stages; ++c) {
    for (const model::ValueSource& src : wiring[c].inputs) {
      if (src.stage < 0 || src.stage == c - 1) continue;
      const bool known = std::any_of(skips.begin(), skips.end(), [&](const SkipPair& p) {
        return p.producer == src.stage && p.consumer == c;
      });
      if (!known) skips.push_back(SkipPair{src.stage, c});
    }
  }
  ASSIGN_OR_RETURN(auto optimizer, MakeOptimizer(spec.training.optimizer, parameters));

  // A resumed job starts from its checkpoint: parameters, optimizer state, and the timeline's
  // position (which is also the data stream's).
  int64_t base_step = 0;
  if (task_.has_resume()) {
    // Forward-only tasks (inference on a checkpoint) take the weights only.
    const v1::ResumeTask& resume = task_.resume();
    for (auto& [s, stage] : stages) {
      ASSIGN_OR_RETURN(const v1::StageCheckpointFile file, FindStageStateFile(resume, s));
      if (forward_only) {
        RETURN_IF_ERROR(
            RestoreStageParameters(resume.directory(), file, s, stage->NamedParameters()));
      } else {
        RETURN_IF_ERROR(RestoreStageCheckpoint(resume.directory(), file, s,
                                               stage->NamedParameters(), *optimizer));
      }
    }
    base_step = resume.step();
    spdlog::info("{} rank {}: resumed from {} (step {})", task_.job_id(), rank, resume.directory(),
                 base_step);
  }

  std::vector<schedule::Action> actions;
  for (int i = 0; i < task_.actions_size(); ++i) {
    auto action = schedule::ParseRequiredAction(task_.actions(i));
    if (!action.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("actions[", i, "]: ", action.status().message()));
    }
    actions.push_back(*std::move(action));
  }

  // An Infer job's batch, checked before the data plane is set up (see InferenceMicrobatches).
  std::vector<torch::Tensor> client_inputs;
  if (inference && stages.count(0) > 0) {
    if (!task_.inference().has_inputs()) {
      return absl::InvalidArgumentError("inference.inputs: required on the rank owning stage 0");
    }
    ASSIGN_OR_RETURN(client_inputs,
                     InferenceMicrobatches(task_.inference().inputs(), m, *stages.at(0)));
  }

  // The data plane.
  const absl::Duration comm_timeout = rpc::FromProtoDuration(task_.comm_timeout());
  TransportRequest request;
  request.backend = task_.transport();
  request.rank = rank;
  request.world_size = task_.world_size();
  request.prefix = task_.rendezvous_prefix();
  request.timeout = comm_timeout;
  request.stage_to_rank.assign(task_.stage_to_rank().begin(), task_.stage_to_rank().end());
  request.forward_only = forward_only;
  request.skips = skips;
  ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> transport,
                   deps_.make_transport(request, store_.get()));
  {
    absl::MutexLock lock(&mu_);
    transport_ = transport.get();
    stage0_ = stages.count(0) > 0 ? stages.at(0) : nullptr;
    if (stop_requested_) transport_->Abort();
  }
  auto forget_transport = [&] {
    absl::MutexLock lock(&mu_);
    transport_ = nullptr;
    stage0_ = nullptr;
  };

  ExecutorOptions options;
  options.rank = rank;
  options.num_stages = num_stages;
  options.num_microbatches = m;
  options.stage_to_rank.assign(task_.stage_to_rank().begin(), task_.stage_to_rank().end());
  options.comm_timeout = comm_timeout;
  options.scale_grads = spec.training.scale_grads;
  options.loss = loss;
  options.forward_only = forward_only;
  options.device = device;
  options.wiring = wiring;
  PipelineExecutor executor(options, transport.get(), stages);

  const bool owns_first = stages.count(0) > 0;
  const bool owns_last = stages.count(num_stages - 1) > 0;
  const bool want_targets = owns_last && !forward_only;
  // The data stream, opened once (a tokens file is read here, by the ranks that need it).
  std::unique_ptr<BatchSource> data;
  if (!inference) {
    auto opened = BatchSource::Open(spec, owns_first, want_targets);
    if (!opened.ok()) {
      forget_transport();
      return opened.status();
    }
    data = *std::move(opened);
  }
  std::vector<TensorMeta> first_inputs;
  if (owns_first) {
    absl::StatusOr<std::vector<torch::Tensor>> first;
    if (inference) {
      first = client_inputs;
    } else if (auto batch = data->Make(base_step); batch.ok()) {
      first = SplitMicrobatches(batch->inputs, m);
    } else {
      first = batch.status();
    }
    if (!first.ok()) {
      forget_transport();
      return first.status();
    }
    first_inputs = MetasOf(*first);
  }
  absl::Status agreed = executor.AgreeShapes(first_inputs);
  if (!agreed.ok()) {
    forget_transport();
    return agreed;
  }
  spdlog::info("{} rank {}: stages ready, {}{} actions, timeline at step {}", task_.job_id(), rank,
               forward_only ? "forward-only, " : "", actions.size(), base_step);

  const std::string ckpt_dir = forward_only ? "" : spec.training.checkpoint.dir;
  const int64_t every = spec.training.checkpoint.every_steps;
  int64_t last_checkpoint = -1;  // the global step of the latest checkpoint this task wrote
  // Writes every stage of this rank after `global_steps` steps; lists the files in `report`.
  auto checkpoint = [&](int64_t global_steps, v1::ReportStepRequest* report) -> absl::Status {
    for (auto& [s, stage] : stages) {
      ASSIGN_OR_RETURN(std::vector<v1::StageCheckpointFile> files,
                       WriteStageCheckpoint(ckpt_dir, global_steps, s, stage->NamedParameters(),
                                            *optimizer, /*data_position=*/global_steps));
      for (auto& file : files) *report->add_checkpoint_files() = std::move(file);
    }
    spdlog::info("{} rank {}: checkpoint after step {} in {}", task_.job_id(), rank, global_steps,
                 CheckpointStepDir(ckpt_dir, global_steps));
    return absl::OkStatus();
  };
  // The report of a step that started at `start` with the transport's stats at `before`.
  auto make_report = [&](const StepResult& result, absl::Time start,
                         const transport::TransferStats& before, int64_t step,
                         int64_t global_step) {
    const transport::TransferStats after = transport->stats();
    v1::ReportStepRequest report;
    report.set_worker_id(deps_.worker_id);
    report.set_job_id(task_.job_id());
    report.set_attempt(task_.attempt());
    report.set_rank(rank);
    report.set_step(step);
    report.set_global_step(global_step);
    for (double l : result.microbatch_losses) report.add_microbatch_losses(l);
    for (const auto& a : result.executed) report.add_executed_actions(a);
    report.set_bytes_sent(after.bytes_sent - before.bytes_sent);
    report.set_bytes_received(after.bytes_received - before.bytes_received);
    for (const auto& [peer, bytes] : result.bytes_sent_to) {
      (*report.mutable_bytes_sent_to())[peer] = bytes;
    }
    for (const auto& [peer, bytes] : result.bytes_received_from) {
      (*report.mutable_bytes_received_from())[peer] = bytes;
    }
    report.set_parameters(held_parameters);
    *report.mutable_step_time() = rpc::ToProtoDuration(absl::Now() - start);
    for (const ActionTiming& t : result.timings) {
      v1::ActionTiming* timing = report.add_action_timings();
      timing->set_start_us(absl::ToInt64Microseconds(t.start));
      timing->set_end_us(absl::ToInt64Microseconds(t.end));
      timing->set_wait_us(absl::ToInt64Microseconds(t.wait));
    }
    *report.mutable_step_start_time() = rpc::ToProtoTimestamp(result.start);
    report.set_bubble_ratio(result.bubble_ratio);
    return report;
  };
  auto send_report = [&](const v1::ReportStepRequest& report) {
    absl::Status reported = deps_.reporter->ReportStep(report);
    if (!reported.ok()) {
      spdlog::warn("{} rank {}: reporting step {}: {}", task_.job_id(), rank, report.step(),
                   reported.message());
    }
  };
  // The last stage's outputs of a forward-only step, merged along dim 0.
  auto merged_outputs = [&](const StepResult& result) -> absl::StatusOr<v1::TensorData> {
    const size_t got = std::count_if(result.outputs.begin(), result.outputs.end(),
                                     [](const torch::Tensor& t) { return t.defined(); });
    if (got != static_cast<size_t>(m)) {
      return absl::InternalError(absl::StrCat("rank ", rank, ": the step produced ", got, " of ", m,
                                              " microbatch outputs"));
    }
    return ToTensorData(torch::cat(result.outputs, 0));
  };

  // A step that counts in the timeline (a data step or a training client step) on `inputs`
  // (stage 0's microbatches) and `targets` (the last stage's).
  auto counted_step = [&](const std::vector<torch::Tensor>& inputs,
                          const std::vector<torch::Tensor>& targets,
                          bool client_batch) -> absl::Status {
    const int64_t step = steps_done_.load();  // the task's count
    int64_t global = 0;                       // the step's number in the job's timeline
    {
      absl::MutexLock lock(&mu_);
      global = global_steps_done_;
    }
    const absl::Time start = absl::Now();
    const transport::TransferStats before = transport->stats();
    if (!forward_only) optimizer->zero_grad();
    ASSIGN_OR_RETURN(StepResult result, executor.RunStep(actions, inputs, targets));
    if (!forward_only) optimizer->step();
    if (inference && owns_last) {
      ASSIGN_OR_RETURN(inference_outputs_, merged_outputs(result));
    }
    v1::ReportStepRequest report = make_report(result, start, before, step, global + 1);
    report.set_client_batch(client_batch);
    // A checkpoint every training.checkpoint.every_steps steps of the timeline and after the
    // requested steps; its files go with the step's report.
    bool requested = false;
    {
      absl::MutexLock lock(&mu_);
      global_steps_done_ = global + 1;
      executing_ = false;
      requested = checkpoint_steps_.count(global + 1) > 0;
    }
    if (!ckpt_dir.empty() && (requested || (every > 0 && (global + 1) % every == 0))) {
      RETURN_IF_ERROR(checkpoint(global + 1, &report));
      last_checkpoint = global + 1;
    }
    send_report(report);
    steps_done_.store(step + 1);
    return absl::OkStatus();
  };

  // Whether the executor's agreed shapes are the data's (a training client step of another
  // shape changes them until the next data step agrees them again).
  bool data_shapes = true;
  auto data_step = [&]() -> absl::Status {
    std::vector<torch::Tensor> inputs, targets;
    if (inference) {
      inputs = client_inputs;
    } else {
      int64_t global = 0;
      {
        absl::MutexLock lock(&mu_);
        global = global_steps_done_;
      }
      ASSIGN_OR_RETURN(Batch batch, data->Make(global));
      if (owns_first) inputs = SplitMicrobatches(batch.inputs, m);
      if (want_targets) targets = SplitMicrobatches(batch.targets, m);
    }
    if (!data_shapes) {
      RETURN_IF_ERROR(executor.AgreeShapes(MetasOf(inputs)));
      data_shapes = true;
    }
    return counted_step(inputs, targets, /*client_batch=*/false);
  };

  // Forward-only client steps run the forward actions of the training list on an executor of
  // their own (a forward-only task's list and executor already are).
  std::unique_ptr<PipelineExecutor> forward_executor;
  std::vector<schedule::Action> forward_actions;
  auto forward_client_step = [&](const ClientBatch& batch) -> absl::Status {
    PipelineExecutor* fx = &executor;
    const std::vector<schedule::Action>* fa = &actions;
    if (!forward_only) {
      if (forward_executor == nullptr) {
        ExecutorOptions forward_options = options;
        forward_options.forward_only = true;
        forward_executor =
            std::make_unique<PipelineExecutor>(forward_options, transport.get(), stages);
        forward_actions = ForwardActions(actions);
      }
      fx = forward_executor.get();
      fa = &forward_actions;
    } else {
      data_shapes = false;
    }
    RETURN_IF_ERROR(fx->AgreeShapes(MetasOf(batch.inputs)));
    int64_t global = 0;
    {
      absl::MutexLock lock(&mu_);
      global = global_steps_done_;
    }
    const absl::Time start = absl::Now();
    const transport::TransferStats before = transport->stats();
    ASSIGN_OR_RETURN(StepResult result, fx->RunStep(*fa, batch.inputs, {}));
    v1::ReportStepRequest report = make_report(result, start, before, steps_done_.load(), global);
    report.set_client_batch(true);
    report.set_forward_only_step(true);
    if (owns_last) {
      ASSIGN_OR_RETURN(*report.mutable_outputs(), merged_outputs(result));
    }
    {
      absl::MutexLock lock(&mu_);
      executing_ = false;
    }
    send_report(report);
    return absl::OkStatus();
  };
  auto training_client_step = [&](const ClientBatch& batch) -> absl::Status {
    RETURN_IF_ERROR(executor.AgreeShapes(MetasOf(batch.inputs)));
    data_shapes = false;
    return counted_step(batch.inputs, batch.targets, /*client_batch=*/true);
  };

  // A checkpoint of the position the task holds at (a paused job's CheckpointJob), reported on
  // its own; one already written there (every_steps, a requested step) is not written twice.
  auto checkpoint_at_hold = [&](int64_t global) -> absl::Status {
    if (ckpt_dir.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank,
                       ": a checkpoint was asked for, but the job has no "
                       "training.checkpoint.dir"));
    }
    if (last_checkpoint == global) return absl::OkStatus();
    v1::ReportStepRequest report;
    report.set_worker_id(deps_.worker_id);
    report.set_job_id(task_.job_id());
    report.set_attempt(task_.attempt());
    report.set_rank(rank);
    report.set_step(steps_done_.load() - 1);
    report.set_global_step(global);
    report.set_checkpoint_only(true);
    report.set_parameters(held_parameters);
    RETURN_IF_ERROR(checkpoint(global, &report));
    last_checkpoint = global;
    send_report(report);
    return absl::OkStatus();
  };

  // The step gate (see the file comment).
  absl::Status status;
  while (status.ok()) {
    std::unique_ptr<ClientBatch> client;
    int64_t hold_checkpoint = -1;
    {
      absl::MutexLock lock(&mu_);
      if (stop_requested_) {
        status = absl::CancelledError(absl::StrCat("stopped: ", stop_reason_));
        break;
      }
      if (checkpoint_at_hold_) {
        checkpoint_at_hold_ = false;
        hold_checkpoint = global_steps_done_;
      } else if (pending_client_ != nullptr) {
        client = std::move(pending_client_);
      } else if (global_steps_done_ >= step_limit_) {
        if (finish_at_limit_) {
          finishing_ = true;
          break;
        }
        status = HoldLocked();
        continue;
      }
      if (hold_checkpoint < 0) executing_ = true;
    }
    if (hold_checkpoint >= 0) {
      status = checkpoint_at_hold(hold_checkpoint);
      continue;
    }
    if (client == nullptr) {
      status = data_step();
    } else if (client->forward_only) {
      status = forward_client_step(*client);
    } else {
      status = training_client_step(*client);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    finishing_ = true;
  }
  if (status.ok()) {
    // Every rank is done with the data plane before any tears it down.
    status = transport->Barrier(comm_timeout);
  } else {
    transport->Abort();
  }
  forget_transport();
  return status;
}

}  // namespace stagecoach::runtime
