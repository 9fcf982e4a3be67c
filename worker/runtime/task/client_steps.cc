#include "worker/runtime/task/client_steps.h"

#include <torch/torch.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/rpc/tensor_data.h"
#include "common/spec/hf_model_spec.h"
#include "common/spec/spec_parser.h"
#include "common/util/status_macros.h"
#include "worker/runtime/executor/forward_actions.h"
#include "worker/runtime/task/tensor_data.h"
#include "worker/runtime/data/document_rows.h"
#include "worker/runtime/data/training_data.h"

namespace stagecoach::runtime {
namespace {

// "[2, 3]".
std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Floating point to the model's dtype (float32); other dtypes as they are.
torch::Tensor ToModelDtype(torch::Tensor t) {
  return t.is_floating_point() ? t.to(torch::kFloat32) : t;
}

// client_step.row_lengths as a tensor.
torch::Tensor RowLengths(const v1::ClientStep& cs) {
  return torch::tensor(std::vector<int64_t>(cs.row_lengths().begin(), cs.row_lengths().end()));
}

// Which ends of the pipeline `task`'s rank owns.
struct Ends {
  bool first = false;
  bool last = false;
};

Ends EndsOf(const v1::TaskAssignment& task) {
  Ends ends;
  for (const v1::StageAssignment& st : task.stages()) {
    ends.first = ends.first || st.stage() == 0;
    ends.last = ends.last || st.stage() == task.num_stages() - 1;
  }
  return ends;
}

// client_step.global_step and the step_limit that must come with it.
absl::Status CheckClientStepLimit(const v1::ControlTaskRequest& request) {
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
        " client step needs step_limit = client_step.global_step", cs.forward_only() ? "" : " + 1",
        " (", want_limit, "), got ", request.step_limit()));
  }
  return absl::OkStatus();
}

// Stage 0's inputs, on the rank owning it: the task's replica's `m` microbatches.
absl::Status DecodeInputs(const v1::ClientStep& cs, int rank, bool owns_first, int m,
                          const ReplicaShare& share, ClientBatch& batch) {
  if (owns_first != cs.has_inputs()) {
    return absl::InvalidArgumentError(
        owns_first
            ? absl::StrCat("client_step.inputs: required on rank ", rank, ", which owns stage 0")
            : absl::StrCat("client_step.inputs: only for the rank owning stage 0, not ", "rank ",
                           rank));
  }
  if (!owns_first) return absl::OkStatus();
  ASSIGN_OR_RETURN(torch::Tensor x, FromTensorData(cs.inputs(), "client_step.inputs"));
  if (x.sizes().vec() != std::vector<int64_t>(cs.inputs_shape().begin(), cs.inputs_shape().end())) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_step.inputs: ", rpc::DescribeTensorData(cs.inputs()),
                     " does not have client_step.inputs_shape ", ShapeString(cs.inputs_shape())));
  }
  batch.inputs = ReplicaMicrobatches(ToModelDtype(x), m, share);
  return absl::OkStatus();
}

// The last stage's targets of a training client step, on its rank: the task's replica's `m`
// microbatches.
absl::Status DecodeTargets(const v1::ClientStep& cs, int rank, bool owns_last, int m,
                           const ReplicaShare& share, ClientBatch& batch) {
  const bool wants_targets = owns_last && !cs.forward_only();
  if (wants_targets != cs.has_targets()) {
    return absl::InvalidArgumentError(
        wants_targets
            ? absl::StrCat("client_step.targets: required on rank ", rank,
                           ", which owns the last stage, for a training client step")
            : absl::StrCat("client_step.targets: only for the rank owning the last stage of a ",
                           "training client step, not rank ", rank));
  }
  if (!wants_targets) return absl::OkStatus();
  const int64_t rows = cs.inputs_shape(0);
  ASSIGN_OR_RETURN(torch::Tensor y, FromTensorData(cs.targets(), "client_step.targets"));
  if (y.dim() < 1 || y.size(0) != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_step.targets: ", rpc::DescribeTensorData(cs.targets()),
                     " must have one row per input row (", rows, ")"));
  }
  if (!cs.row_lengths().empty()) {
    if (y.is_floating_point() || y.dim() < 2 || y.size(1) != cs.inputs_shape(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "client_step.targets: ragged rows need integer targets of the inputs' ", "padded width (",
          cs.inputs_shape(1), "), got ", rpc::DescribeTensorData(cs.targets())));
    }
    // Past its length a row is padding: its targets are ignored whatever the client sent.
    const torch::Tensor lengths = RowLengths(cs);
    y = y.masked_fill(torch::arange(y.size(1)).unsqueeze(0) >= lengths.unsqueeze(1),
                      kIgnoredTarget);
  }
  batch.targets = ReplicaMicrobatches(ToModelDtype(y), m, share);
  if (!y.is_floating_point()) batch.counted_tokens = CountedTokens(y);
  return absl::OkStatus();
}

// Ragged rows (client_step.row_lengths): each microbatch cut to its longest row when the job's
// shapes vary per microbatch (a training step of a job with data.packing), else every
// microbatch to the replica's longest row; the shapes agreed before the step stay the padded
// batch's in the first case.
absl::Status CutRaggedRows(const v1::ClientStep& cs, bool dynamic_shapes, int m,
                           const ReplicaShare& share, ClientBatch& batch) {
  if (cs.row_lengths().empty()) return absl::OkStatus();
  if (cs.inputs_shape_size() < 2 || cs.row_lengths_size() != cs.inputs_shape(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_step.row_lengths: ", cs.row_lengths_size(), " lengths for inputs ",
                     ShapeString(cs.inputs_shape())));
  }
  const bool each = dynamic_shapes && !cs.forward_only();
  CutToLongestRows(ReplicaMicrobatches(RowLengths(cs), m, share), each,
                   {&batch.inputs, &batch.targets});
  if (!each) batch.planned = MetasOf(batch.inputs);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepGate::ClientStep> DecodeClientStep(const v1::TaskAssignment& task,
                                                      const v1::ControlTaskRequest& request) {
  const v1::ClientStep& cs = request.client_step();
  RETURN_IF_ERROR(CheckClientStepLimit(request));
  ASSIGN_OR_RETURN(const spec::JobSpec spec, spec::ReadJobSpec(task.spec_yaml(), task.job_id()));
  const int m = spec.schedule.microbatches;
  if (cs.inputs_shape().empty()) {
    return absl::InvalidArgumentError("client_step.inputs_shape: required");
  }
  const int64_t rows = cs.inputs_shape(0);
  const ReplicaShare share = ShareOf(task);
  if (rows < static_cast<int64_t>(m) * share.replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_step.inputs_shape: ", ShapeString(cs.inputs_shape()), " has ", rows,
                     " rows, fewer than the job's ", m, " microbatches",
                     share.replicas > 1 ? absl::StrCat(" x ", share.replicas, " replicas") : ""));
  }
  const Ends ends = EndsOf(task);
  auto batch = std::make_unique<ClientBatch>();
  RETURN_IF_ERROR(DecodeInputs(cs, task.rank(), ends.first, m, share, *batch));
  RETURN_IF_ERROR(DecodeTargets(cs, task.rank(), ends.last, m, share, *batch));
  batch->planned = MetasOf(batch->inputs);
  RETURN_IF_ERROR(
      CutRaggedRows(cs, /*dynamic_shapes=*/!spec.data.packing.empty(), m, share, *batch));
  StepGate::ClientStep step;
  step.global_step = cs.global_step();
  step.forward_only = cs.forward_only();
  step.payload = std::move(batch);
  return step;
}

absl::Status CheckStage0Takes(const std::vector<torch::Tensor>& microbatches,
                              model::StageModel& stage0, absl::string_view field) {
  const std::vector<torch::Tensor> params = stage0.Parameters();
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params[0].device();
  torch::NoGradGuard no_grad;
  for (size_t mb = 0; mb < microbatches.size(); ++mb) {
    if (mb > 0 && microbatches[mb].sizes() == microbatches[mb - 1].sizes()) continue;
    try {
      stage0.ForwardValues({microbatches[mb].to(device)});
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": stage 0 cannot take microbatch ", mb, " of shape ",
                       ShapeString(absl::MakeConstSpan(microbatches[mb].sizes().data(),
                                                       microbatches[mb].sizes().size())),
                       ": ", e.what_without_backtrace()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<torch::Tensor>> InferenceMicrobatches(const v1::TensorData& inputs,
                                                                 int microbatches,
                                                                 const ReplicaShare& share,
                                                                 model::StageModel& stage0) {
  ASSIGN_OR_RETURN(torch::Tensor x, FromTensorData(inputs, "inference.inputs"));
  if (x.dim() < 1 || x.size(0) < static_cast<int64_t>(microbatches) * share.replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference.inputs: ", rpc::DescribeTensorData(inputs), " has fewer rows than ",
                     microbatches * share.replicas, " microbatches"));
  }
  std::vector<torch::Tensor> out = ReplicaMicrobatches(ToModelDtype(x), microbatches, share);
  RETURN_IF_ERROR(CheckStage0Takes(out, stage0, "inference.inputs"));
  return out;
}

ClientSteps::ClientSteps(const StepEnv& env, DataSteps* data) : env_(env), data_(data) {}

absl::Status ClientSteps::Run(const StepGate::ClientStep& step, int64_t global_step) {
  const auto* batch = dynamic_cast<const ClientBatch*>(step.payload.get());
  if (batch == nullptr) {
    return absl::InternalError(absl::StrCat("rank ", env_.task->rank(), ": the client step at ",
                                            global_step, " carries no batch"));
  }
  if (step.forward_only) return RunForward(*batch, global_step);
  RETURN_IF_ERROR(data_->AgreeOtherShapes(batch->planned));
  return data_->RunCounted(batch->inputs, batch->targets, /*client_batch=*/true, global_step,
                           batch->counted_tokens);
}

absl::Status ClientSteps::RunForward(const ClientBatch& batch, int64_t global_step) {
  PipelineExecutor* executor = &data_->executor();
  const std::vector<schedule::Action>* actions = &env_.setup->actions;
  if (env_.setup->forward_only) {
    RETURN_IF_ERROR(data_->AgreeOtherShapes(batch.planned));
  } else {
    if (forward_executor_ == nullptr) {
      ExecutorOptions options = data_->executor_options();
      options.forward_only = true;
      forward_executor_ =
          std::make_unique<PipelineExecutor>(options, env_.transport, env_.setup->stages->by_index);
      forward_actions_ = ForwardActions(env_.setup->actions);
    }
    executor = forward_executor_.get();
    actions = &forward_actions_;
    RETURN_IF_ERROR(executor->AgreeShapes(batch.planned));
  }
  const StepMark mark = env_.reports->Mark();
  ASSIGN_OR_RETURN(StepResult result, executor->RunStep(*actions, batch.inputs, {}));
  v1::ReportStepRequest report =
      env_.reports->Step(result, mark, env_.steps_done->load(), global_step);
  report.set_client_batch(true);
  report.set_forward_only_step(true);
  if (env_.setup->stages->Owns(env_.task->num_stages() - 1)) {
    ASSIGN_OR_RETURN(
        *report.mutable_outputs(),
        MergedOutputs(result, data_->executor_options().num_microbatches, env_.task->rank()));
  }
  env_.gate->EndUncountedStep();
  env_.reports->Send(report);
  return absl::OkStatus();
}

}  // namespace stagecoach::runtime
