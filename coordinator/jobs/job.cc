#include "coordinator/jobs/job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/time_conversion.h"
#include "common/schedule/generators.h"
#include "common/util/logging.h"
#include "coordinator/jobs/plan_memory.h"

namespace stagecoach::coordinator {

bool IsFinal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

absl::Status CheckTransition(v1::JobState from, v1::JobState to) {
  using S = v1::JobState;
  bool allowed = false;
  if (from == S::JOB_STATE_UNSPECIFIED) {
    allowed = to == S::JOB_STATE_PLANNING;
  } else if (!IsFinal(from) && from != v1::JOB_STATE_UNSPECIFIED &&
             (to == S::JOB_STATE_FAILED || to == S::JOB_STATE_CANCELLED)) {
    allowed = true;
  } else {
    switch (from) {
      case S::JOB_STATE_PLANNING:
        allowed = to == S::JOB_STATE_PENDING;
        break;
      case S::JOB_STATE_PENDING:
        allowed = to == S::JOB_STATE_STARTING;
        break;
      case S::JOB_STATE_STARTING:
        allowed = to == S::JOB_STATE_RUNNING || to == S::JOB_STATE_PAUSED ||
                  to == S::JOB_STATE_RESTARTING;
        break;
      case S::JOB_STATE_RUNNING:
        allowed = to == S::JOB_STATE_PAUSED || to == S::JOB_STATE_SUCCEEDED ||
                  to == S::JOB_STATE_RESTARTING;
        break;
      case S::JOB_STATE_PAUSED:
        allowed = to == S::JOB_STATE_RUNNING || to == S::JOB_STATE_RESTARTING;
        break;
      case S::JOB_STATE_RESTARTING:
        allowed = to == S::JOB_STATE_STARTING;
        break;
      default:
        allowed = false;
    }
  }
  if (allowed) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("job cannot go from ", JobStateName(from), " to ", JobStateName(to)));
}

std::string JobStateName(v1::JobState state) {
  const std::string& full = v1::JobState_Name(state);
  constexpr absl::string_view kPrefix = "JOB_STATE_";
  if (full.compare(0, kPrefix.size(), kPrefix.data(), kPrefix.size()) == 0) {
    return full.substr(kPrefix.size());
  }
  return full;
}

absl::Status Job::TransitionTo(v1::JobState to, const std::string& why, absl::Time now) {
  absl::Status allowed = CheckTransition(state, to);
  if (!allowed.ok()) return allowed;
  state = to;
  reason = why;
  v1::JobTransition transition;
  transition.set_state(to);
  transition.set_reason(why);
  *transition.mutable_time() = rpc::ToProtoTimestamp(now);
  history.push_back(transition);
  v1::JobEvent event;
  *event.mutable_state_change() = transition;
  AddEvent(std::move(event), now);
  // An ended job keeps small action lists (plan_memory.h), until room is needed.
  if (IsFinal(to) && PlanMemoryBytes(plan) > kKeptPlanBytes) ReleaseActionLists();
  return absl::OkStatus();
}

void Job::ReleaseActionLists() {
  schedule::PipelineOrder().swap(plan.lowered);
  for (RankSlot& rank : ranks) {
    std::vector<std::string>().swap(rank.actions);
    std::vector<std::string>().swap(rank.executed_actions);
  }
  partial_steps.clear();
  actions_released = true;
}

void Job::AddEvent(v1::JobEvent event, absl::Time now) { events.Add(std::move(event), id, now); }

std::optional<absl::Time> Job::FinishedTime() const {
  if (!IsFinal(state) || history.empty()) return std::nullopt;
  return rpc::FromProtoTimestamp(history.back().time());
}

std::string Job::RendezvousPrefix() const {
  return absl::StrCat("jobs/", id, "/attempt-", attempt, "/");
}

namespace {

// The window's job steps [first, end) within `size` recorded steps.
std::pair<int64_t, int64_t> WindowSteps(const HistoryWindow& window, int64_t size) {
  if (window.steps < 0) return {0, size};
  const int64_t first =
      window.latest ? std::max<int64_t>(0, size - window.steps) : std::min(window.first_step, size);
  return {first, first + std::min(window.steps, size - first)};
}

}  // namespace

void Job::MemoryToProto(v1::Job* out) const {
  const size_t ranks = std::max(
      {plan.predicted_memory.size(), measured_peak_bytes.size(), measured_max_bytes.size()});
  for (size_t r = 0; r < ranks; ++r) {
    v1::RankMemory* m = out->add_memory();
    m->set_rank(static_cast<int>(r));
    if (r < plan.predicted_memory.size()) {
      m->set_predicted_static_bytes(plan.predicted_memory[r].static_bytes);
      m->set_predicted_peak_bytes(plan.predicted_memory[r].peak_bytes);
      m->set_predicted_peak_action(plan.predicted_memory[r].peak_action);
    }
    if (r < measured_peak_bytes.size()) m->set_measured_peak_bytes(measured_peak_bytes[r]);
    if (r < measured_max_bytes.size()) m->set_measured_max_bytes(measured_max_bytes[r]);
  }
}

void Job::ToProto(v1::Job* out, const HistoryWindow& window, Detail detail) const {
  out->set_id(id);
  out->set_name(spec.name);
  out->set_state(state);
  out->set_reason(reason);
  const int64_t omitted =
      window.transitions < 0
          ? 0
          : std::max<int64_t>(0, static_cast<int64_t>(history.size()) - window.transitions);
  out->set_history_transitions_omitted(omitted);
  for (size_t i = static_cast<size_t>(omitted); i < history.size(); ++i) {
    *out->add_history() = history[i];
  }
  out->set_steps_done(steps_done());
  out->set_steps_total(finish_step - base_step);
  // Every completed step has a bubble ratio; forward-only steps have no loss.
  const int64_t ratios = static_cast<int64_t>(max_bubble_ratios.size());
  const int64_t recorded = static_cast<int64_t>(losses.size());
  const auto [first, end] = WindowSteps(window, std::max(recorded, ratios));
  out->set_history_first_step(first);
  out->mutable_losses()->Add(losses.begin() + std::min(first, recorded),
                             losses.begin() + std::min(end, recorded));
  out->mutable_max_bubble_ratios()->Add(max_bubble_ratios.begin() + std::min(first, ratios),
                                        max_bubble_ratios.begin() + std::min(end, ratios));
  for (int64_t step : missing_loss_steps) {
    if (step >= first && step < end) out->add_missing_loss_steps(step);
  }
  // Whole history: every skipped step and eval, even those past the losses recorded so far.
  const bool whole = window.steps < 0;
  training.ToProto(out, base_step + first, whole ? INT64_MAX : base_step + end);
  if (data_records.has_value()) *out->mutable_data_records() = *data_records;
  DiagnosisToProto(out);
  out->set_num_stages(plan.num_stages);
  out->set_num_ranks(plan.num_ranks);
  out->set_replicas(plan.replicas);
  out->set_schedule(plan.schedule_name);
  out->set_microbatches(plan.num_microbatches);
  out->set_split(plan.split);
  MemoryToProto(out);
  if (plan_choice.has_value()) *out->mutable_plan_choice() = *plan_choice;
  RanksToProto(out, detail == Detail::kFull);
  out->set_healthy_replicas(replica_health.carry_on() ? replica_health.healthy() : plan.replicas);
  for (int lost : replica_health.lost()) out->add_lost_replicas(lost);
  out->set_healing_replica(replica_health.healing());
  if (snapshots.latest().has_value()) *out->mutable_snapshot() = *snapshots.latest();
  for (const std::string& id : spare_workers) out->add_spare_workers(id);
  if (detail == Detail::kFull) out->set_spec_yaml(spec_yaml);
  *out->mutable_created_time() = rpc::ToProtoTimestamp(created);
  for (const v1::JobCheckpoint& c : checkpoints) *out->add_checkpoints() = c;
  if (resumed_from.has_value()) *out->mutable_resumed_from() = *resumed_from;
  out->set_restarts(restarts);
  out->set_max_restarts(spec.restart.max_restarts);
  if (failure.has_value()) *out->mutable_failure() = *failure;
  out->set_global_steps_done(global_done());
  out->set_pause_at_global_step(hold_step >= 0 ? hold_step : 0);
  out->set_attempt(attempt);
}

void Job::RanksToProto(v1::Job* out, bool actions) const {
  for (const RankSlot& slot : ranks) {
    v1::RankStatus* r = out->add_ranks();
    r->set_rank(slot.rank);
    r->set_replica(slot.replica);
    r->set_reduction_bytes_sent(slot.reduction_bytes_sent);
    r->set_reduction_hidden_ratio(slot.reduction_hidden_ratio);
    r->set_gather_hidden_ratio(slot.gather_hidden_ratio);
    r->set_held_parameter_bytes(slot.held_parameter_bytes);
    r->set_held_gradient_bytes(slot.held_gradient_bytes);
    r->set_peak_live_bytes(slot.peak_live_bytes);
    for (const auto& [stage, digest] : slot.parameter_digests) {
      (*r->mutable_parameter_digests())[stage] = digest;
    }
    r->set_worker_id(slot.worker_id);
    for (int s : slot.stages) r->add_stages(s);
    if (actions) {
      for (const auto& a : slot.actions) r->add_assigned_actions(a);
      for (const auto& a : slot.executed_actions) r->add_executed_actions(a);
    }
    r->set_steps_done(slot.steps_done);
    r->set_bytes_sent(slot.bytes_sent);
    r->set_bytes_received(slot.bytes_received);
    for (const auto& [peer, bytes] : slot.bytes_sent_to)
      (*r->mutable_bytes_sent_to())[peer] = bytes;
    for (const auto& [peer, bytes] : slot.bytes_received_from) {
      (*r->mutable_bytes_received_from())[peer] = bytes;
    }
    r->set_parameters(slot.parameters);
    r->set_replica_lost(slot.replica_lost);
  }
}

void Job::DiagnosisToProto(v1::Job* out) const {
  if (state == v1::JOB_STATE_RUNNING && diagnosis.stall().has_value()) {
    *out->mutable_stall() = *diagnosis.stall();
  }
  for (v1::RankStraggler& s : diagnosis.stragglers().Stragglers()) {
    const size_t task = static_cast<size_t>(plan.TaskIndex(s.replica(), s.rank()));
    if (task < ranks.size()) s.set_worker_id(ranks[task].worker_id);
    *out->add_stragglers() = std::move(s);
  }
  for (const v1::RankPace& pace : diagnosis.stragglers().Pace()) *out->add_pace() = pace;
}

void Job::ToRecord(v1::Job* out, const HistoryWindow& window) const {
  ToProto(out, window);
  // The plan's partition: the model's layers and each stage's share of them.
  for (const v1::LayerInfo& layer : plan.layers) *out->add_layers() = layer;
  for (const StagePlan& stage : plan.stages) {
    v1::StageAssignment* st = out->add_stages();
    st->set_stage(stage.stage);
    st->set_first_layer(stage.first_layer);
    st->set_end_layer(stage.end_layer);
    st->set_parameters(stage.parameters);
  }
}

void Job::BalanceToProto(v1::Job* out) const {
  int64_t step = -1;
  const std::map<int, RankStepTiming>* reports = traces.LatestComplete(plan.num_ranks, &step);
  if (reports != nullptr && step != balance.step) {
    absl::StatusOr<MeasuredBalance> replayed = ReplayStep(plan, step, *reports);
    if (replayed.ok()) {
      balance = *std::move(replayed);
    } else {
      // Said once per step; the predictions stand alone.
      spdlog::warn("job {}: {}", id, replayed.status().message());
      balance = MeasuredBalance{};
      balance.step = step;
    }
  }
  coordinator::BalanceToProto(plan, reports != nullptr ? balance : MeasuredBalance{}, out);
}

void Job::ToSummary(v1::Job* out) const {
  // The latest step's loss only (the list's LOSS column), no transitions.
  ToProto(out, HistoryWindow{0, 1, 0, true}, Detail::kSummary);
}

}  // namespace stagecoach::coordinator
