#include "worker/runtime/task/data_steps.h"

#include <utility>

#include "common/rpc/time_conversion.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

// PyTorch's zero_grad(set_to_none=True), its default since 2.0: the step's first gradient of a
// parameter becomes its .grad as it is (the same numbers as adding it to zeros), instead of a
// pass that writes zeros and one that adds to them. LibTorch 1.13's zero_grad() writes zeros.
void ClearGradients(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (torch::Tensor& p : group.params()) p.mutable_grad() = torch::Tensor();
  }
}

}  // namespace
}  // namespace stagecoach::runtime

namespace stagecoach::runtime {

std::vector<TensorMeta> MetasOf(const std::vector<torch::Tensor>& microbatches) {
  std::vector<TensorMeta> out;
  for (const auto& mb : microbatches) out.push_back(TensorMeta{mb.sizes().vec(), mb.scalar_type()});
  return out;
}

DataSteps::DataSteps(const StepEnv& env) : env_(env) {
  const v1::TaskAssignment& task = *env.task;
  const TaskSetup& setup = *env.setup;
  options_.rank = task.rank();
  options_.num_stages = task.num_stages();
  options_.num_microbatches = setup.spec.schedule.microbatches;
  options_.stage_to_rank.assign(task.stage_to_rank().begin(), task.stage_to_rank().end());
  options_.comm_timeout = rpc::FromProtoDuration(task.comm_timeout());
  options_.scale_grads = setup.spec.training.scale_grads;
  options_.loss = setup.loss;
  options_.forward_only = setup.forward_only;
  options_.device = setup.device;
  options_.wiring = setup.stages->wiring;
  options_.recompute = setup.spec.training.activation_checkpointing == "full";
  options_.precision = setup.precision;
  if (setup.device.is_cpu()) options_.memory_counter = env.memory_counter;
  if (env.reducer != nullptr) {
    options_.on_gradients_ready = [reducer = env.reducer](int stage) {
      reducer->StageReady(stage);
    };
  }
  executor_ = std::make_unique<PipelineExecutor>(options_, env.transport, setup.stages->by_index);
  owns_first_ = setup.stages->Owns(0);
  owns_last_ = setup.stages->Owns(task.num_stages() - 1);
  want_targets_ = owns_last_ && !setup.forward_only;
}

absl::StatusOr<std::unique_ptr<DataSteps>> DataSteps::Create(const StepEnv& env) {
  std::unique_ptr<DataSteps> steps(new DataSteps(env));
  const TaskSetup& setup = *env.setup;
  if (!setup.inference) {
    ASSIGN_OR_RETURN(steps->data_,
                     BatchSource::Open(setup.spec, steps->owns_first_, steps->want_targets_));
  }
  if (setup.spec.eval.has_value() && !setup.forward_only) {
    ASSIGN_OR_RETURN(steps->evaluator_,
                     Evaluator::Create(*env.task, setup, env.transport, steps->options_));
  }
  std::vector<TensorMeta> first_inputs;
  if (steps->owns_first_) {
    if (setup.inference) {
      first_inputs = MetasOf(setup.inference_inputs);
    } else {
      ASSIGN_OR_RETURN(Batch batch, steps->data_->Make(setup.base_step));
      first_inputs = MetasOf(
          ReplicaMicrobatches(batch.inputs, steps->options_.num_microbatches, ShareOf(*env.task)));
    }
  }
  RETURN_IF_ERROR(steps->executor_->AgreeShapes(first_inputs));
  return steps;
}

absl::Status DataSteps::RunDataStep(int64_t global_step) {
  std::vector<torch::Tensor> inputs, targets;
  if (env_.setup->inference) {
    inputs = env_.setup->inference_inputs;
  } else {
    ASSIGN_OR_RETURN(Batch batch, data_->Make(global_step));
    const int m = options_.num_microbatches;
    const ReplicaShare share = ShareOf(*env_.task);
    if (owns_first_) inputs = ReplicaMicrobatches(batch.inputs, m, share);
    if (want_targets_) targets = ReplicaMicrobatches(batch.targets, m, share);
  }
  if (!data_shapes_) {
    RETURN_IF_ERROR(executor_->AgreeShapes(MetasOf(inputs)));
    data_shapes_ = true;
  }
  return RunCounted(inputs, targets, /*client_batch=*/false, global_step);
}

absl::Status DataSteps::RunCounted(const std::vector<torch::Tensor>& inputs,
                                   const std::vector<torch::Tensor>& targets, bool client_batch,
                                   int64_t global_step) {
  const TaskSetup& setup = *env_.setup;
  const int64_t step = env_.steps_done->load();  // the task's count
  const StepMark mark = env_.reports->Mark();
  if (!setup.forward_only) ClearGradients(*setup.optimizer);
  if (setup.shards != nullptr) setup.shards->ClearStageGradients();
  if (env_.reducer != nullptr) env_.reducer->BeginStep(mark.start);
  ASSIGN_OR_RETURN(StepResult result, executor_->RunStep(setup.actions, inputs, targets));
  std::optional<ReductionReport> reduction;
  if (env_.reducer != nullptr) {
    ASSIGN_OR_RETURN(reduction, env_.reducer->Finish());
  }
  if (env_.tied != nullptr) RETURN_IF_ERROR(env_.tied->SumGradients());
  // The step's bytes: the pipeline's and the tied copies' (not the job reduction's few).
  const transport::TransferStats pipeline_end = env_.transport->stats();
  std::optional<RecipeDecision> decision;
  if (env_.recipe != nullptr) {
    ASSIGN_OR_RETURN(decision, env_.recipe->Prepare(global_step, *setup.optimizer));
  }
  const bool stepped = !setup.forward_only && !(decision.has_value() && decision->skip);
  if (stepped) setup.optimizer->step();
  if (reduction.has_value() && stepped) {
    RETURN_IF_ERROR(env_.reducer->GatherParameters(*reduction));
  }
  // The forwards updated each replica's buffers from its own rows: replica 0's hold from here.
  if (reduction.has_value()) RETURN_IF_ERROR(env_.reducer->BroadcastBuffers());
  if (setup.inference && owns_last_) {
    ASSIGN_OR_RETURN(*env_.inference_outputs,
                     MergedOutputs(result, options_.num_microbatches, options_.rank));
  }
  v1::ReportStepRequest report =
      env_.reports->Step(result, mark, step, global_step + 1, pipeline_end);
  if (reduction.has_value()) StepReports::AddReduction(*reduction, mark, &report);
  if (decision.has_value()) StepReports::AddRecipe(*decision, &report);
  if (evaluator_ != nullptr && evaluator_->DueAfter(global_step)) {
    ASSIGN_OR_RETURN(const std::vector<double> eval_losses, evaluator_->Run());
    report.set_evaluated(true);
    for (double loss : eval_losses) report.add_eval_microbatch_losses(loss);
  }
  report.set_client_batch(client_batch);
  const StepGate::StepEnd end = env_.gate->EndCountedStep();
  RETURN_IF_ERROR(env_.checkpoints->AfterStep(end.steps_done, end.checkpoint_requested, &report));
  env_.reports->Send(report);
  env_.steps_done->store(step + 1);
  return absl::OkStatus();
}

absl::Status DataSteps::AgreeOtherShapes(const std::vector<torch::Tensor>& inputs) {
  data_shapes_ = false;
  return executor_->AgreeShapes(MetasOf(inputs));
}

}  // namespace stagecoach::runtime
