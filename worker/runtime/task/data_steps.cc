#include "worker/runtime/task/data_steps.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "worker/runtime/data/document_rows.h"
#include "worker/runtime/sharding/held_memory.h"

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

// STAGECOACH_FAULT_STEP_STALL="<global step>:<milliseconds>" (tests only): the step at that
// global step stalls that long before its passes, so its peers wait inside their transfers.
std::optional<DataSteps::Stall> StepStallFromEnvironment() {
  const char* value = std::getenv("STAGECOACH_FAULT_STEP_STALL");
  if (value == nullptr) return std::nullopt;
  const std::vector<std::string> parts = absl::StrSplit(value, ':');
  int64_t step = 0;
  int64_t ms = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &step) || !absl::SimpleAtoi(parts[1], &ms) ||
      step < 0 || ms <= 0) {
    spdlog::warn("ignoring STAGECOACH_FAULT_STEP_STALL=\"{}\": not <global step>:<milliseconds>",
                 value);
    return std::nullopt;
  }
  return DataSteps::Stall{step, absl::Milliseconds(ms)};
}

}  // namespace
}  // namespace stagecoach::runtime

namespace stagecoach::runtime {

std::vector<TensorMeta> MetasOf(const std::vector<torch::Tensor>& microbatches) {
  std::vector<TensorMeta> out;
  for (const auto& mb : microbatches) out.push_back(TensorMeta{mb.sizes().vec(), mb.scalar_type()});
  return out;
}

DataSteps::DataSteps(const StepEnv& env) : env_(env), stall_(StepStallFromEnvironment()) {
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
  // Rows of documents run padded to their microbatch's longest row.
  options_.dynamic_shapes = !setup.spec.data.packing.empty() && !setup.inference;
  if (setup.device.is_cpu()) options_.memory_counter = env.memory_counter;
  options_.progress = env.progress;
  options_.debug_slow_factor = env.debug_slow_factor;
  options_.sharding = env.gathering;
  if (env.reducer != nullptr) {
    options_.on_gradients_ready = [reducer = env.reducer](int stage) {
      reducer->StageReady(stage);
    };
  }
  executor_ = std::make_unique<PipelineExecutor>(options_, env.transport, setup.stages->by_index);
  owns_first_ = setup.stages->Owns(0);
  owns_last_ = setup.stages->Owns(task.num_stages() - 1);
  want_targets_ = owns_last_ && !setup.forward_only;
  tokens_normalized_ = !setup.forward_only && spec::LossNormalizationOf(setup.spec) == "tokens";
}

std::optional<TokenNormalization> DataSteps::TokensOf(int64_t counted_tokens) const {
  if (!tokens_normalized_ || !want_targets_) return std::nullopt;
  return TokenNormalization{counted_tokens, static_cast<double>(ShareOf(*env_.task).replicas)};
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

std::vector<DataSteps::Pass> DataSteps::PassesOf(const Batch& batch) const {
  const int m = options_.num_microbatches;
  std::vector<int> slices = {env_.task->replica()};
  if (env_.membership != nullptr) slices = env_.membership->slices();
  std::vector<Pass> passes;
  for (int slice : slices) {
    const ReplicaShare share{slice, ShareOf(*env_.task).replicas};
    Pass& pass = passes.emplace_back();
    if (owns_first_) pass.inputs = ReplicaMicrobatches(batch.inputs, m, share);
    if (want_targets_) pass.targets = ReplicaMicrobatches(batch.targets, m, share);
    pass.planned = MetasOf(pass.inputs);
    if (!batch.row_lengths.defined()) continue;
    if (batch.segments.defined()) pass.segments = ReplicaMicrobatches(batch.segments, m, share);
    // Each microbatch's inputs, targets and segments cut to its longest row.
    CutToLongestRows(ReplicaMicrobatches(batch.row_lengths, m, share), /*each=*/true,
                     {&pass.inputs, &pass.targets, &pass.segments});
  }
  return passes;
}

absl::Status DataSteps::RunDataStep(int64_t global_step) {
  if (env_.setup->inference) {
    if (!data_shapes_) {
      RETURN_IF_ERROR(executor_->AgreeShapes(MetasOf(env_.setup->inference_inputs)));
      data_shapes_ = true;
    }
    const std::vector<torch::Tensor>& inputs = env_.setup->inference_inputs;
    return RunPasses({Pass{inputs, {}, MetasOf(inputs), {}}}, false, global_step, 0).status();
  }
  ASSIGN_OR_RETURN(Batch batch, data_->Make(global_step));
  const int64_t counted_tokens =
      tokens_normalized_ && want_targets_ ? CountedTokens(batch.targets) : 0;
  for (;;) {
    const std::vector<Pass> passes = PassesOf(batch);
    if (!data_shapes_ && passes.size() == 1) {
      RETURN_IF_ERROR(executor_->AgreeShapes(passes.front().planned));
      data_shapes_ = true;
    }
    ASSIGN_OR_RETURN(const bool counted,
                     RunPasses(passes, /*client_batch=*/false, global_step, counted_tokens));
    if (counted) return absl::OkStatus();
  }
}

absl::Status DataSteps::RunCounted(const std::vector<torch::Tensor>& inputs,
                                   const std::vector<torch::Tensor>& targets, bool client_batch,
                                   int64_t global_step, int64_t counted_tokens) {
  if (env_.membership != nullptr &&
      env_.membership->slices() != std::vector<int>{env_.task->replica()}) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", env_.task->rank(), " replica ", env_.task->replica(),
        ": a client batch step needs every replica, and the job carries on without a lost one"));
  }
  ASSIGN_OR_RETURN(const bool counted, RunPasses({Pass{inputs, targets, MetasOf(inputs), {}}},
                                                 client_batch, global_step, counted_tokens));
  if (!counted) {
    return absl::AbortedError(absl::StrCat("rank ", env_.task->rank(), " replica ",
                                           env_.task->replica(),
                                           ": the client batch step at global step ", global_step,
                                           " was abandoned (a replica was lost)"));
  }
  return absl::OkStatus();
}

namespace {

// Adds a later pass's losses, bytes and peak to the first pass's result.
void MergePass(StepResult& into, StepResult pass) {
  into.microbatch_losses.insert(into.microbatch_losses.end(), pass.microbatch_losses.begin(),
                                pass.microbatch_losses.end());
  for (const auto& [peer, bytes] : pass.bytes_sent_to) into.bytes_sent_to[peer] += bytes;
  for (const auto& [peer, bytes] : pass.bytes_received_from)
    into.bytes_received_from[peer] += bytes;
  into.peak_activation_bytes = std::max(into.peak_activation_bytes, pass.peak_activation_bytes);
}

}  // namespace

absl::StatusOr<bool> DataSteps::ReduceAndSettle(const StepResult& result, int64_t step,
                                                int64_t global_step,
                                                std::optional<ReductionReport>* reduction) {
  absl::Status group = absl::OkStatus();
  if (env_.reducer != nullptr) {
    absl::StatusOr<ReductionReport> reduced = env_.reducer->Finish();
    group = reduced.status();
    if (reduced.ok()) {
      *reduction = *std::move(reduced);
      // The forwards updated each replica's buffers from its own rows: the first replica's hold
      // from here (before the settling, so that nothing of the group runs after the commit).
      group = env_.reducer->BroadcastBuffers();
    }
  }
  if (!group.ok() && env_.membership == nullptr) return group;
  // On every rank of the pipeline, whatever the group did: it is a transfer between two of them.
  if (env_.tied != nullptr) RETURN_IF_ERROR(env_.tied->SumGradients());
  if (env_.membership == nullptr) return true;
  ASSIGN_OR_RETURN(
      const ReplicaMembership::Outcome outcome,
      env_.membership->Settle(step, global_step, group,
                              owns_last_ ? result.microbatch_losses : std::vector<double>{}));
  if (outcome == ReplicaMembership::Outcome::kCommit) return true;
  env_.rollback->Restore();
  return false;
}

absl::StatusOr<bool> DataSteps::RunPasses(const std::vector<Pass>& passes, bool client_batch,
                                          int64_t global_step, int64_t counted_tokens) {
  const TaskSetup& setup = *env_.setup;
  const int64_t step = env_.steps_done->load();  // the task's count
  const StepMark mark = env_.reports->Mark();
  const bool several = passes.size() > 1;
  if (stall_.has_value() && stall_->global_step == global_step) {
    spdlog::warn("rank {}: stalling before global step {} for {} (STAGECOACH_FAULT_STEP_STALL)",
                 options_.rank, global_step, absl::FormatDuration(stall_->duration));
    absl::SleepFor(stall_->duration);
  }
  if (env_.progress != nullptr) env_.progress->BeginStep(global_step);
  if (!setup.forward_only) ClearGradients(*setup.optimizer);
  if (setup.shards != nullptr) setup.shards->ClearStageGradients();
  if (env_.rollback != nullptr) env_.rollback->Take();
  if (env_.reducer != nullptr) env_.reducer->BeginStep(mark.start, several);
  if (env_.gathering != nullptr) env_.gathering->BeginStep(mark.start);
  StepResult result;
  for (size_t i = 0; i < passes.size(); ++i) {
    // Each slice from the step's start, with its own shapes (the last slices may hold a row
    // fewer per microbatch).
    if (i > 0) env_.rollback->Restore();
    if (several) RETURN_IF_ERROR(executor_->AgreeShapes(passes[i].planned));
    const std::vector<torch::Tensor>* segments =
        passes[i].segments.empty() ? nullptr : &passes[i].segments;
    ASSIGN_OR_RETURN(StepResult pass,
                     executor_->RunStep(setup.actions, passes[i].inputs, passes[i].targets,
                                        TokensOf(counted_tokens), segments));
    if (i == 0) {
      result = std::move(pass);
      if (several) env_.rollback->KeepBuffers();
    } else {
      MergePass(result, std::move(pass));
    }
  }
  if (several) {
    env_.rollback->PutBackKept();
    data_shapes_ = false;
  }
  std::optional<ReductionReport> reduction;
  if (!setup.forward_only) {
    if (env_.reducer != nullptr) Mark(v1::RANK_PHASE_REDUCTION);
    ASSIGN_OR_RETURN(const bool settled, ReduceAndSettle(result, step, global_step, &reduction));
    if (!settled) return false;
  }
  // The step's bytes: the pipeline's and the tied copies' (not the job reduction's few).
  const transport::TransferStats pipeline_end = env_.transport->stats();
  std::optional<RecipeDecision> decision;
  if (!setup.forward_only) Mark(v1::RANK_PHASE_OPTIMIZER);
  if (env_.recipe != nullptr) {
    ASSIGN_OR_RETURN(decision, env_.recipe->Prepare(global_step, *setup.optimizer));
  }
  const bool stepped = !setup.forward_only && !(decision.has_value() && decision->skip);
  if (stepped) setup.optimizer->step();
  if (reduction.has_value() && stepped) {
    RETURN_IF_ERROR(env_.reducer->GatherParameters(*reduction));
  }
  if (setup.inference && owns_last_) {
    ASSIGN_OR_RETURN(*env_.inference_outputs,
                     MergedOutputs(result, options_.num_microbatches, options_.rank));
  }
  v1::ReportStepRequest report =
      env_.reports->Step(result, mark, step, global_step + 1, pipeline_end);
  if (reduction.has_value()) StepReports::AddReduction(*reduction, mark, &report);
  if (env_.gathering != nullptr) {
    StepReports::AddGathers(env_.gathering->Report(), mark, &report);
  }
  if (decision.has_value()) StepReports::AddRecipe(*decision, &report);
  if (evaluator_ != nullptr && evaluator_->DueAfter(global_step)) {
    Mark(v1::RANK_PHASE_EVAL);
    if (env_.membership != nullptr) evaluator_->SetSlices(env_.membership->slices());
    // Evaluation's forwards need whole parameters; every replica evaluates at this step.
    if (env_.gathering != nullptr) RETURN_IF_ERROR(env_.gathering->GatherAll());
    ASSIGN_OR_RETURN(const Evaluator::Losses eval, evaluator_->Run());
    if (env_.gathering != nullptr) env_.gathering->ReleaseAll();
    report.set_evaluated(true);
    for (double loss : eval.losses) report.add_eval_microbatch_losses(loss);
    for (int64_t tokens : eval.tokens) report.add_eval_microbatch_tokens(tokens);
  }
  report.set_client_batch(client_batch);
  if (data_ != nullptr && data_->records().read > 0) {
    const BatchSource::Records records = data_->records();
    v1::DataRecords* out = report.mutable_data_records();
    out->set_read(records.read);
    out->set_truncated(records.truncated);
    out->set_skipped(records.skipped);
  }
  if (want_targets_ && spec::IsTokenData(setup.spec.data)) {
    for (const Pass& pass : passes) {
      for (const torch::Tensor& t : pass.targets) {
        report.set_counted_tokens(report.counted_tokens() + CountedTokens(t));
        report.set_computed_positions(report.computed_positions() + t.numel());
      }
    }
  }
  if (env_.membership != nullptr) {
    for (int slice : env_.membership->slices()) report.add_slices(slice);
  }
  const StepGate::StepEnd end = env_.gate->EndCountedStep();
  Mark(v1::RANK_PHASE_CHECKPOINT);
  RETURN_IF_ERROR(env_.checkpoints->AfterStep(end.steps_done, end.checkpoint_requested, &report));
  if (env_.memory_counter != nullptr && setup.device.is_cpu()) {
    const HeldMemory held = MeasureHeldMemory(setup.stages->by_index, setup.shards.get());
    report.set_held_parameter_bytes(held.parameter_bytes);
    report.set_held_gradient_bytes(held.gradient_bytes);
    report.set_peak_live_bytes(env_.memory_counter->peak_bytes());
  }
  env_.reports->Send(report);
  if (env_.snapshots != nullptr) RETURN_IF_ERROR(env_.snapshots->AfterStep(end.steps_done));
  if (env_.progress != nullptr) {
    env_.progress->SetPhase(v1::RANK_PHASE_BETWEEN_STEPS, global_step + 1);
  }
  env_.steps_done->store(step + 1);
  // A healed replica joins after this step, at once (not at the next step, which a pause may
  // put off while its replacements wait in the group's rendezvous).
  if (env_.membership != nullptr) RETURN_IF_ERROR(env_.membership->ApplyPending());
  return true;
}

absl::Status DataSteps::AgreeOtherShapes(const std::vector<TensorMeta>& inputs) {
  data_shapes_ = false;
  return executor_->AgreeShapes(inputs);
}

}  // namespace stagecoach::runtime
