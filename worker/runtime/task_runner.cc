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

}  // namespace

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
      store_(std::make_unique<CancellableStore>(deps_.store)) {}

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
  requested_checkpoint_ = global_step;
  return absl::OkStatus();
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
  const int64_t num_steps = inference ? 1 : spec.training.steps;
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
  {
    absl::MutexLock lock(&mu_);
    global_steps_done_ = base_step;
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
    if (stop_requested_) transport_->Abort();
  }
  auto forget_transport = [&] {
    absl::MutexLock lock(&mu_);
    transport_ = nullptr;
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
    for (const auto& mb : *first) {
      first_inputs.push_back(TensorMeta{mb.sizes().vec(), mb.scalar_type()});
    }
  }
  absl::Status agreed = executor.AgreeShapes(first_inputs);
  if (!agreed.ok()) {
    forget_transport();
    return agreed;
  }
  spdlog::info("{} rank {}: stages ready, {} {}steps of {} actions", task_.job_id(), rank,
               num_steps, forward_only ? "forward-only " : "", actions.size());

  const std::string ckpt_dir = forward_only ? "" : spec.training.checkpoint.dir;
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

  absl::Status status;
  for (int64_t step = 0; step < num_steps && status.ok(); ++step) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_requested_) {
        status = absl::CancelledError(absl::StrCat("stopped: ", stop_reason_));
        break;
      }
    }
    const int64_t global = base_step + step;  // the step's number in the job's timeline
    const absl::Time start = absl::Now();
    const transport::TransferStats before = transport->stats();
    std::vector<torch::Tensor> inputs, targets;
    if (inference) {
      inputs = client_inputs;
    } else {
      auto batch = data->Make(global);
      if (!batch.ok()) {
        status = batch.status();
        break;
      }
      if (owns_first) inputs = SplitMicrobatches(batch->inputs, m);
      if (want_targets) targets = SplitMicrobatches(batch->targets, m);
    }
    if (!forward_only) optimizer->zero_grad();
    auto result = executor.RunStep(actions, inputs, targets);
    if (!result.ok()) {
      status = result.status();
      break;
    }
    if (!forward_only) optimizer->step();
    const transport::TransferStats after = transport->stats();
    if (inference && owns_last) {
      const size_t got = std::count_if(result->outputs.begin(), result->outputs.end(),
                                       [](const torch::Tensor& t) { return t.defined(); });
      if (got != static_cast<size_t>(m)) {
        status = absl::InternalError(absl::StrCat("rank ", rank, ": the step produced ", got,
                                                  " of ", m, " microbatch outputs"));
        break;
      }
      auto merged = ToTensorData(torch::cat(result->outputs, 0));
      if (!merged.ok()) {
        status = merged.status();
        break;
      }
      inference_outputs_ = *std::move(merged);
    }

    v1::ReportStepRequest report;
    report.set_worker_id(deps_.worker_id);
    report.set_job_id(task_.job_id());
    report.set_attempt(task_.attempt());
    report.set_rank(rank);
    report.set_step(step);
    report.set_global_step(global + 1);
    for (double l : result->microbatch_losses) report.add_microbatch_losses(l);
    for (const auto& a : result->executed) report.add_executed_actions(a);
    report.set_bytes_sent(after.bytes_sent - before.bytes_sent);
    report.set_bytes_received(after.bytes_received - before.bytes_received);
    for (const auto& [peer, bytes] : result->bytes_sent_to) {
      (*report.mutable_bytes_sent_to())[peer] = bytes;
    }
    for (const auto& [peer, bytes] : result->bytes_received_from) {
      (*report.mutable_bytes_received_from())[peer] = bytes;
    }
    report.set_parameters(held_parameters);
    *report.mutable_step_time() = rpc::ToProtoDuration(absl::Now() - start);
    for (const ActionTiming& t : result->timings) {
      v1::ActionTiming* timing = report.add_action_timings();
      timing->set_start_us(absl::ToInt64Microseconds(t.start));
      timing->set_end_us(absl::ToInt64Microseconds(t.end));
      timing->set_wait_us(absl::ToInt64Microseconds(t.wait));
    }
    *report.mutable_step_start_time() = rpc::ToProtoTimestamp(result->start);
    report.set_bubble_ratio(result->bubble_ratio);
    // A checkpoint every training.checkpoint.every_steps steps of the timeline, at the end of
    // the task, and when the coordinator asked for one after this step; its files go with the
    // step's report.
    bool requested = false;
    {
      absl::MutexLock lock(&mu_);
      global_steps_done_ = global + 1;
      requested = requested_checkpoint_ == global + 1;
    }
    const int64_t every = spec.training.checkpoint.every_steps;
    if (!ckpt_dir.empty() &&
        (requested || step + 1 == num_steps || (every > 0 && (global + 1) % every == 0))) {
      status = checkpoint(global + 1, &report);
      if (!status.ok()) break;
    }
    absl::Status reported = deps_.reporter->ReportStep(report);
    if (!reported.ok()) {
      spdlog::warn("{} rank {}: reporting step {}: {}", task_.job_id(), rank, step,
                   reported.message());
    }
    steps_done_.store(step + 1);
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
