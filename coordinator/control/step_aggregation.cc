#include "coordinator/control/step_aggregation.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/tensor_data.h"
#include "common/rpc/time_conversion.h"
#include "common/util/logging.h"
#include "common/util/status_macros.h"
#include "coordinator/diagnosis/straggler_rule.h"
#include "coordinator/lifecycle/failure_investigation.h"

namespace stagecoach::coordinator {
namespace {

bool OwnsLastStage(const Job& job, int rank) {
  return job.plan.stage_to_rank[job.plan.num_stages - 1] == rank;
}

// Slice `i`'s values of a report that holds, batch by batch, each of `slices` slices' `m`
// microbatch values one slice after another.
template <typename Repeated>
auto SliceValues(const Repeated& all, int m, int slices, int i) {
  std::vector<std::decay_t<decltype(all[0])>> out;
  for (int j = 0; j < all.size() / (m * slices); ++j) {
    const int from = (j * slices + i) * m;
    out.insert(out.end(), all.begin() + from, all.begin() + from + m);
  }
  return out;
}

}  // namespace

absl::Status StepAggregator::CheckLocked(const Job& job, const RankSlot& slot,
                                         const v1::ReportStepRequest& req) const {
  if (req.step() != slot.steps_done) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", RankLabel(req.rank(), req.replica()),
                                                   " reported step ", req.step(), ", expected ",
                                                   slot.steps_done));
  }
  const int slices = std::max(req.slices_size(), 1);
  for (int s : req.slices()) {
    if (s < 0 || s >= job.plan.replicas) {
      return absl::InvalidArgumentError(absl::StrCat("slices: ", s, " is not a replica slice (",
                                                     job.plan.replicas, " replicas)"));
    }
  }
  if (OwnsLastStage(job, req.rank()) && !job.forward_only() &&
      req.microbatch_losses_size() != job.plan.num_microbatches * slices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "microbatch_losses: the last stage's rank must report ", job.plan.num_microbatches,
        " losses per slice (", slices, " slices), got ", req.microbatch_losses_size()));
  }
  if (req.evaluated() && OwnsLastStage(job, req.rank()) && job.spec.eval.has_value() &&
      req.eval_microbatch_losses_size() !=
          job.spec.eval->batches * job.plan.num_microbatches * slices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval_microbatch_losses: the last stage's rank must report eval.batches x slices x "
        "microbatches (",
        job.spec.eval->batches * job.plan.num_microbatches * slices, ") losses, got ",
        req.eval_microbatch_losses_size()));
  }
  if (req.eval_microbatch_tokens_size() != 0 &&
      req.eval_microbatch_tokens_size() != req.eval_microbatch_losses_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval_microbatch_tokens: one count per eval microbatch loss (",
        req.eval_microbatch_losses_size(), "), got ", req.eval_microbatch_tokens_size()));
  }
  for (int64_t tokens : req.eval_microbatch_tokens()) {
    if (tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval_microbatch_tokens: a negative count ", tokens));
    }
  }
  if (req.held_parameter_bytes() < 0 || req.held_gradient_bytes() < 0 ||
      req.peak_live_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "held_parameter_bytes / held_gradient_bytes / peak_live_bytes: negative (",
        req.held_parameter_bytes(), " / ", req.held_gradient_bytes(), " / ",
        req.peak_live_bytes(), ")"));
  }
  if (req.action_timings_size() != 0 && req.action_timings_size() != req.executed_actions_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("action_timings: expected one per executed action (",
                     req.executed_actions_size(), "), got ", req.action_timings_size()));
  }
  return absl::OkStatus();
}

bool StepAggregator::AddLocked(Job& job, RankSlot& slot, const v1::ReportStepRequest& req,
                               absl::Time now) {
  slot.steps_done = req.step() + 1;
  slot.bytes_sent += req.bytes_sent();
  slot.bytes_received += req.bytes_received();
  for (const auto& [peer, bytes] : req.bytes_sent_to()) slot.bytes_sent_to[peer] += bytes;
  for (const auto& [peer, bytes] : req.bytes_received_from()) {
    slot.bytes_received_from[peer] += bytes;
  }
  if (metrics_ != nullptr) metrics_->AddDataPlaneBytes(req.bytes_sent(), req.bytes_received());
  slot.parameters = req.parameters();
  if (req.has_reduction()) {
    slot.reduction_bytes_sent += req.reduction().bytes_sent();
    slot.reduction_hidden_ratio = req.reduction().hidden_ratio();
    slot.gather_hidden_ratio = req.reduction().gather_hidden_ratio();
  }
  slot.held_parameter_bytes = req.held_parameter_bytes();
  slot.held_gradient_bytes = req.held_gradient_bytes();
  slot.peak_live_bytes = req.peak_live_bytes();
  slot.executed_actions.assign(req.executed_actions().begin(), req.executed_actions().end());
  const int64_t global = job.attempt_base + req.step();  // the step's number in the timeline
  if (req.action_timings_size() > 0) {
    RankStepTiming timing{job.plan.TaskIndex(slot.replica, slot.rank),
                          slot.replica,
                          job.plan.replicas > 1
                              ? absl::StrCat("Replica ", slot.replica, " rank ", slot.rank)
                              : std::string(),
                          {req.executed_actions().begin(), req.executed_actions().end()},
                          {req.action_timings().begin(), req.action_timings().end()},
                          rpc::FromProtoTimestamp(req.step_start_time()),
                          {req.reduction().buckets().begin(), req.reduction().buckets().end()},
                          req.bubble_ratio(),
                          {req.reduction().gathers().begin(), req.reduction().gathers().end()}};
    if (job.diagnosis.attempt() == job.attempt) {
      job.diagnosis.stragglers().Add(global, timing.rank,
                                     SampleStep(timing.actions, timing.timings));
    }
    job.traces.Add(global, std::move(timing));
  }
  StepAggregate& agg = job.partial_steps[req.step()];
  agg.tasks_reported.insert(job.plan.TaskIndex(slot.replica, slot.rank));
  if (!agg.has_recipe && !job.forward_only()) {
    // Every rank took the same decisions (the job reduction); the first report carries them.
    agg.has_recipe = true;
    agg.learning_rate = req.learning_rate();
    if (req.has_grad_norm()) agg.grad_norm = req.grad_norm();
    agg.skipped = req.skipped();
    agg.nonfinite_ranks.assign(req.nonfinite_ranks().begin(), req.nonfinite_ranks().end());
  }
  if (req.evaluated()) {
    agg.evaluated = true;
    if (OwnsLastStage(job, req.rank())) {
      // Batch by batch, each batch's slices one after another: by slice, batch by batch.
      const int m = job.plan.num_microbatches;
      const std::vector<int> slices =
          req.slices().empty() ? std::vector<int>{slot.replica}
                               : std::vector<int>(req.slices().begin(), req.slices().end());
      const int n = static_cast<int>(slices.size());
      for (int i = 0; i < n; ++i) {
        agg.replica_eval_losses[slices[i]] = SliceValues(req.eval_microbatch_losses(), m, n, i);
        agg.replica_eval_tokens[slices[i]] = SliceValues(req.eval_microbatch_tokens(), m, n, i);
      }
    }
  }
  agg.slowest = std::max(agg.slowest, rpc::FromProtoDuration(req.step_time()));
  if (OwnsLastStage(job, req.rank()) && !job.forward_only()) {
    const int m = job.plan.num_microbatches;
    const std::vector<int> slices =
        req.slices().empty() ? std::vector<int>{slot.replica}
                             : std::vector<int>(req.slices().begin(), req.slices().end());
    for (size_t i = 0; i < slices.size(); ++i) {
      agg.replica_losses[slices[i]].assign(req.microbatch_losses().begin() + i * m,
                                           req.microbatch_losses().begin() + (i + 1) * m);
    }
  }
  const int task = job.plan.TaskIndex(slot.replica, slot.rank);
  if (req.has_data_records()) job.data_records = req.data_records();
  if (req.computed_positions() > 0) {
    agg.counted_and_computed[task] = {req.counted_tokens(), req.computed_positions()};
  }
  agg.bubble_ratios.resize(job.plan.num_tasks(), 0.0);
  agg.bubble_ratios[task] = req.bubble_ratio();
  agg.peak_activation_bytes.resize(job.plan.num_tasks(), 0);
  agg.peak_activation_bytes[task] = req.peak_activation_bytes();
  if (job.plan.replicas > 1) {
    agg.hidden_ratios.resize(job.plan.num_tasks(), 0.0);
    agg.hidden_ratios[task] = req.reduction().hidden_ratio();
  }
  for (const auto& [stage, digest] : req.parameter_digests()) {
    slot.parameter_digests[stage] = digest;
    auto [seen, first] = agg.digests.try_emplace(stage, slot.replica, digest);
    if (!first && seen->second.second != digest && agg.divergence.empty()) {
      agg.divergence =
          absl::StrCat("replicas ", seen->second.first, " and ", slot.replica, " of stage ", stage,
                       " hold different parameters after global step ", global + 1, " (SHA-256 ",
                       seen->second.second.substr(0, 12), "... and ", digest.substr(0, 12), "...)");
    }
  }
  if (req.client_batch()) agg.client_batch = true;
  if (!AllReportedLocked(job, agg, req.step())) return false;
  CompleteStepLocked(job, req.step(), now);
  return true;
}

bool StepAggregator::AllReportedLocked(const Job& job, const StepAggregate& agg, int64_t step) {
  for (const RankSlot& slot : job.ranks) {
    // A lost replica's ranks report nothing; a healed one's from where it rejoined.
    if (slot.replica_lost || slot.first_step > step) continue;
    if (agg.tasks_reported.count(job.plan.TaskIndex(slot.replica, slot.rank)) == 0) return false;
  }
  return !job.ranks.empty();
}

void StepAggregator::AddSettledLossesLocked(Job& job, int64_t step,
                                            std::map<int, std::vector<double>> losses) {
  StepAggregate& agg = job.partial_steps[step];
  for (auto& [slice, list] : losses) agg.replica_losses[slice] = std::move(list);
}

int StepAggregator::CompleteWaitingStepsLocked(Job& job, absl::Time now) {
  int completed = 0;
  std::vector<int64_t> complete;
  for (const auto& [step, agg] : job.partial_steps) {
    if (step == job.steps_completed + static_cast<int64_t>(complete.size()) &&
        !agg.tasks_reported.empty() && AllReportedLocked(job, agg, step)) {
      complete.push_back(step);
    }
  }
  for (int64_t step : complete) {
    CompleteStepLocked(job, step, now);
    ++completed;
  }
  return completed;
}

void StepAggregator::CompleteStepLocked(Job& job, int64_t step_index, absl::Time now) {
  StepAggregate agg = std::move(job.partial_steps[step_index]);
  job.partial_steps.erase(step_index);
  // Replica by replica: the global batch's microbatches in order.
  for (const auto& [replica, losses] : agg.replica_losses) {
    agg.microbatch_losses.insert(agg.microbatch_losses.end(), losses.begin(), losses.end());
  }
  const bool forward_only = job.forward_only();
  const int64_t global = job.attempt_base + step_index;
  ++job.steps_completed;
  if (job.recovering_since.has_value()) {
    // The first step completed since a failure: what the recovery took and lost.
    if (metrics_ != nullptr) {
      metrics_->recovery().Recovered(
          job.recovering_by_restart ? RecoveryMetrics::kRestart : RecoveryMetrics::kCarryOn,
          now - *job.recovering_since,
          job.recovering_by_restart
              ? std::max<int64_t>(0, job.global_done_at_failure - job.attempt_base)
              : 0);
    }
    job.recovering_since.reset();
  }
  if (!agg.divergence.empty() && job.step_failure.empty()) job.step_failure = agg.divergence;
  // Steps after a restart's checkpoint replace those the failed attempt had recorded.
  const size_t index = static_cast<size_t>(global - job.base_step);
  // Steps before this one with no record (PrepareAttemptLocked restarts where the losses on
  // record end, so only a lost record leaves any): NaN and named as missing, never invented.
  if (!forward_only) {
    for (size_t missing = job.losses.size(); missing < index; ++missing) {
      spdlog::error("{}: no loss on record for step {}; it is shown as missing", job.id, missing);
      job.missing_loss_steps.push_back(static_cast<int64_t>(missing));
    }
  }
  job.max_bubble_ratios.resize(index, std::nan(""));
  job.max_bubble_ratios.push_back(
      *std::max_element(agg.bubble_ratios.begin(), agg.bubble_ratios.end()));
  v1::JobEvent event;
  v1::StepCompleted* step = event.mutable_step_completed();
  step->set_step(global - job.base_step);
  step->set_global_step(global);
  step->set_steps_total(job.finish_step - job.base_step);
  step->set_client_batch(agg.client_batch);
  std::optional<double> loss;
  if (!forward_only) {
    // Normalised by tokens, each microbatch's loss is already its share of the step's (its
    // summed token loss over the global batch's count): the step's loss is their sum.
    loss = std::accumulate(agg.microbatch_losses.begin(), agg.microbatch_losses.end(), 0.0);
    if (spec::LossNormalizationOf(job.spec) != "tokens") {
      *loss /= static_cast<double>(agg.microbatch_losses.size());
    }
    if (agg.skipped) loss.reset();
    job.losses.resize(index, std::nan(""));
    job.losses.push_back(loss.value_or(std::nan("")));
    if (loss.has_value()) step->set_loss(*loss);
    RecordRecipeLocked(job, agg, global, *step);
  }
  *step->mutable_step_time() = rpc::ToProtoDuration(agg.slowest);
  for (double ratio : agg.bubble_ratios) step->add_bubble_ratios(ratio);
  step->set_num_ranks(job.plan.num_ranks);
  for (double ratio : agg.hidden_ratios) step->add_reduction_hidden_ratios(ratio);
  RecordMemoryLocked(job, agg, *step);
  const double seconds = absl::ToDoubleSeconds(agg.slowest);
  step->set_samples_per_second(seconds > 0 ? job.spec.training.batch_size / seconds : 0.0);
  int64_t counted = 0, computed = 0;
  for (const auto& [task, counts] : agg.counted_and_computed) {
    counted += counts.first;
    computed += counts.second;
  }
  if (computed > 0) {
    step->set_tokens_per_second(seconds > 0 ? static_cast<double>(counted) / seconds : 0.0);
    step->set_padding_waste(1.0 - static_cast<double>(counted) / static_cast<double>(computed));
  }
  if (metrics_ != nullptr) {
    metrics_->StepCompleted(job.id, agg.slowest, loss, step->samples_per_second(),
                            agg.bubble_ratios, agg.hidden_ratios, job.plan.num_ranks);
    if (job.plan.replicas > 1) {
      metrics_->ReplicaHealth(
          job.id, job.replica_health.carry_on() ? job.replica_health.healthy() : job.plan.replicas,
          job.plan.replicas);
    }
    if (!forward_only) {
      metrics_->RecipeStep(
          job.id, step->learning_rate(),
          step->has_grad_norm() ? std::optional<double>(step->grad_norm()) : std::nullopt,
          step->skipped(),
          step->has_eval_loss() ? std::optional<double>(step->eval_loss()) : std::nullopt);
    }
    if (computed > 0) {
      metrics_->TokenStep(job.id, step->tokens_per_second(), step->padding_waste());
    }
    MemoryMetricsLocked(job, agg);
  }
  // A client batch step (StepJob) hands its losses to its caller.
  if (job.client_step.has_value() && !job.client_step->forward_only &&
      job.client_step->global_step == global) {
    job.client_step->losses = agg.microbatch_losses;
    job.client_step->loss = loss;
    job.client_step->slowest = agg.slowest;
    job.client_step->done = true;
  }
  job.AddEvent(std::move(event), now);
  RecordDiagnosisLocked(job, global, now);
}

void StepAggregator::RecordDiagnosisLocked(Job& job, int64_t global, absl::Time now) {
  job.diagnosis.StepCompleted(now);
  if (job.diagnosis.attempt() != job.attempt) return;
  for (v1::StragglerEvent& change : job.diagnosis.stragglers().Complete(global, now)) {
    v1::RankStraggler& s = *change.mutable_straggler();
    const int task = job.plan.TaskIndex(s.replica(), s.rank());
    if (task < static_cast<int>(job.ranks.size())) s.set_worker_id(job.ranks[task].worker_id);
    if (change.straggling()) {
      spdlog::warn(
          "{}: replica {} rank {} ({}) is straggling: its compute is {:.2f}x its peers' "
          "over the latest {} steps",
          job.id, s.replica(), s.rank(), s.worker_id(), s.ratio(), s.window_steps());
    } else {
      spdlog::info("{}: replica {} rank {} is back on pace ({:.2f}x its peers')", job.id,
                   s.replica(), s.rank(), s.ratio());
    }
    v1::JobEvent event;
    *event.mutable_straggler() = std::move(change);
    job.AddEvent(std::move(event), now);
  }
  if (metrics_ != nullptr) {
    metrics_->Diagnosis(job.id, job.diagnosis.stall().has_value(),
                        job.diagnosis.stragglers().Pace());
  }
}

void StepAggregator::RecordMemoryLocked(Job& job, const StepAggregate& agg,
                                        v1::StepCompleted& step) {
  for (int64_t bytes : agg.peak_activation_bytes) step.add_peak_activation_bytes(bytes);
  const bool measured =
      std::any_of(agg.peak_activation_bytes.begin(), agg.peak_activation_bytes.end(),
                  [](int64_t bytes) { return bytes > 0; });
  if (!measured) return;
  const int num_ranks = job.plan.num_ranks;
  job.measured_peak_bytes.assign(num_ranks, 0);
  job.measured_max_bytes.resize(num_ranks, 0);
  for (size_t task = 0; task < agg.peak_activation_bytes.size(); ++task) {
    const int rank = static_cast<int>(task) % num_ranks;
    job.measured_peak_bytes[rank] =
        std::max(job.measured_peak_bytes[rank], agg.peak_activation_bytes[task]);
    job.measured_max_bytes[rank] =
        std::max(job.measured_max_bytes[rank], agg.peak_activation_bytes[task]);
  }
}

void StepAggregator::MemoryMetricsLocked(const Job& job, const StepAggregate& agg) {
  if (std::any_of(agg.peak_activation_bytes.begin(), agg.peak_activation_bytes.end(),
                  [](int64_t bytes) { return bytes > 0; })) {
    std::vector<int64_t> predicted;
    for (const PredictedRankMemory& rank : job.plan.predicted_memory) {
      predicted.push_back(rank.peak_bytes);
    }
    metrics_->RankMemory(job.id, agg.peak_activation_bytes, predicted, job.plan.num_ranks);
  }
  // What each task holds after the step: its slot's latest figures (every task reported it).
  const bool gathers = job.plan.replicas > 1 && spec::ShardsParameters(job.spec);
  std::vector<TaskHeldMemory> tasks;
  bool measured = false;
  for (const RankSlot& slot : job.ranks) {
    TaskHeldMemory t;
    t.held_parameter_bytes = slot.held_parameter_bytes;
    t.held_gradient_bytes = slot.held_gradient_bytes;
    t.peak_live_bytes = slot.peak_live_bytes;
    if (gathers) t.gather_hidden_ratio = slot.gather_hidden_ratio;
    measured = measured || t.held_parameter_bytes > 0 || t.peak_live_bytes > 0;
    tasks.push_back(t);
  }
  if (measured) metrics_->HeldMemory(job.id, tasks, job.plan.num_ranks);
}

std::optional<double> StepAggregator::EvalLoss(const StepAggregate& agg) {
  // Every replica's share of every eval batch. With counts (the loss normalised by tokens):
  // each microbatch's mean loss weighted by the tokens it counted, over all of them. Without:
  // batches of equal microbatch counts, so the mean of the batch losses is the mean of all
  // their microbatch losses.
  double sum = 0.0;
  double count = 0;
  for (const auto& [replica, losses] : agg.replica_eval_losses) {
    const auto tokens = agg.replica_eval_tokens.find(replica);
    const bool weighted = tokens != agg.replica_eval_tokens.end() && !tokens->second.empty();
    for (size_t i = 0; i < losses.size(); ++i) {
      const double weight = weighted ? static_cast<double>(tokens->second[i]) : 1.0;
      if (weight > 0) sum += losses[i] * weight;
      count += weight;
    }
  }
  if (count <= 0) return std::nullopt;
  return sum / count;
}

void StepAggregator::RecordRecipeLocked(Job& job, const StepAggregate& agg, int64_t global,
                                        v1::StepCompleted& step) {
  step.set_learning_rate(agg.learning_rate);
  if (agg.grad_norm.has_value()) step.set_grad_norm(*agg.grad_norm);
  step.set_skipped(agg.skipped);
  for (int rank : agg.nonfinite_ranks) step.add_nonfinite_ranks(rank);
  job.training.AddStep(global, agg.learning_rate, agg.grad_norm, agg.skipped);
  if (agg.evaluated) {
    const std::optional<double> eval_loss = EvalLoss(agg);
    if (eval_loss.has_value()) {
      step.set_eval_loss(*eval_loss);
      job.training.AddEval(global, *eval_loss);
    }
  }
  const int64_t run = job.training.ConsecutiveSkipped();
  if (run >= job.spec.training.max_skipped_steps && job.step_failure.empty()) {
    job.step_failure =
        absl::StrCat(run, " steps in a row (global steps ", global - run + 1, " to ", global,
                     ") were skipped for non-finite gradients, the last on pipeline rank(s) ",
                     absl::StrJoin(agg.nonfinite_ranks, ", "),
                     " (training.max_skipped_steps: ", job.spec.training.max_skipped_steps, ")");
  }
}

absl::Status StepAggregator::AddForwardOnlyLocked(Job& job, const RankSlot& slot,
                                                  const v1::ReportStepRequest& req) {
  if (!job.client_step.has_value() || !job.client_step->forward_only ||
      req.global_step() != job.client_step->global_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward_only_step: rank ", req.rank(), " of ", job.id,
                     " reported a forward-only client step at global step ", req.global_step(),
                     ", but none is in flight there"));
  }
  Job::ClientStepState& cs = *job.client_step;
  if (OwnsLastStage(job, slot.rank)) {
    if (!req.has_outputs()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs: rank ", req.rank(), " owns the last stage and must send its outputs"));
    }
    RETURN_IF_ERROR(rpc::ValidateTensorData(req.outputs(), "outputs"));
    // Each replica's last stage returns the rows of its share of the batch.
    const int64_t rows =
        rpc::ReplicaRows(cs.rows, job.plan.num_microbatches, job.plan.replicas, slot.replica);
    if (req.outputs().shape_size() < 1 || req.outputs().shape(0) != rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs: expected ", rows, " rows (one per input row of ",
          RankLabel(slot.rank, slot.replica), "), got ", rpc::DescribeTensorData(req.outputs())));
    }
    cs.replica_outputs[slot.replica] = req.outputs();
  }
  cs.slowest = std::max(cs.slowest, rpc::FromProtoDuration(req.step_time()));
  if (++cs.ranks_reported < job.plan.num_tasks()) return absl::OkStatus();
  // Every replica's outputs, in replica order: one row per input row.
  std::vector<v1::TensorData> parts;
  for (auto& [replica, outputs] : cs.replica_outputs) parts.push_back(std::move(outputs));
  cs.replica_outputs.clear();
  ASSIGN_OR_RETURN(cs.outputs, rpc::ConcatRows(parts, "outputs"));
  cs.done = true;
  return absl::OkStatus();
}

absl::Status StepAggregator::CheckCheckpointOnly(const RankSlot& slot,
                                                 const v1::ReportStepRequest& req) {
  // At the step it holds at, or (an asynchronous checkpoint, durable now) at any step it did.
  if (req.step() < -1 || req.step() > slot.steps_done - 1 || req.checkpoint_files_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_only: rank ", req.rank(),
                     " must report its files at a step it did (-1 to ", slot.steps_done - 1,
                     "), got step ", req.step(), " with ", req.checkpoint_files_size(), " files"));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::coordinator
