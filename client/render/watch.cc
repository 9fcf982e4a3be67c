// Rendering of a job's event stream for `stagectl watch` and `submit --wait`.
#include "client/render/watch.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/render/render.h"
#include "client/render/render_balance.h"
#include "client/render/render_diagnosis.h"
#include "common/rpc/time_conversion.h"
#include "common/util/byte_size.h"

namespace stagecoach::client {

void ApplyEvent(const v1::JobEvent& event, WatchState* state) {
  if (state->job_id.empty()) state->job_id = event.job_id();
  if (event.has_state_change()) {
    state->state = event.state_change().state();
    return;
  }
  if (!event.has_step_completed()) return;
  const v1::StepCompleted& step = event.step_completed();
  state->has_step = true;
  state->steps_done = step.step() + 1;
  state->steps_total = step.steps_total();
  state->global_step = step.global_step();
  state->loss = step.has_loss() ? std::optional<double>(step.loss()) : std::nullopt;
  state->samples_per_second = step.samples_per_second();
  state->tokens_per_second = step.tokens_per_second();
  state->padding_waste = step.padding_waste();
  state->step_time = rpc::FromProtoDuration(step.step_time());
  state->max_bubble_ratio =
      step.bubble_ratios().empty()
          ? 0.0
          : *std::max_element(step.bubble_ratios().begin(), step.bubble_ratios().end());
  state->bubble_ratios.assign(step.bubble_ratios().begin(), step.bubble_ratios().end());
  state->num_ranks = step.num_ranks();
  state->client_batch = step.client_batch();
  state->learning_rate = step.learning_rate();
  state->grad_norm = step.has_grad_norm() ? std::optional<double>(step.grad_norm()) : std::nullopt;
  state->skipped = step.skipped();
  state->nonfinite_ranks.assign(step.nonfinite_ranks().begin(), step.nonfinite_ranks().end());
  if (step.skipped()) ++state->skipped_seen;
  if (step.has_eval_loss()) state->eval_loss = step.eval_loss();
  state->recent_step_times.push_back(state->step_time);
  while (state->recent_step_times.size() > WatchState::kRecentSteps) {
    state->recent_step_times.pop_front();
  }
  // A step is only reported while the job runs (a replayed log may not say so yet).
  if (state->state == v1::JOB_STATE_UNSPECIFIED) state->state = v1::JOB_STATE_RUNNING;
}

std::optional<absl::Duration> EstimateRemaining(const WatchState& state) {
  if (!state.has_step || state.recent_step_times.empty() || state.state != v1::JOB_STATE_RUNNING) {
    return std::nullopt;
  }
  absl::Duration sum = absl::ZeroDuration();
  for (absl::Duration d : state.recent_step_times) sum += d;
  const absl::Duration mean = sum / static_cast<int64_t>(state.recent_step_times.size());
  return mean * std::max<int64_t>(state.steps_total - state.steps_done, 0);
}

std::string FormatEta(absl::Duration remaining) {
  if (remaining < absl::ZeroDuration() || remaining > absl::Hours(1000)) return "?";
  const int64_t s = absl::ToInt64Seconds(remaining + absl::Milliseconds(500));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
}

namespace {

// The step's bubble: "0.12 mean, 0.31 worst (rank 1)", compactly "0.12/0.31@r1"; the largest
// ratio alone from a coordinator that sends none per rank.
std::string BubbleText(const WatchState& state, bool compact) {
  if (state.bubble_ratios.empty()) return absl::StrFormat("%.2f", state.max_bubble_ratio);
  const auto worst = std::max_element(state.bubble_ratios.begin(), state.bubble_ratios.end());
  const int task = static_cast<int>(worst - state.bubble_ratios.begin());
  const double mean = std::accumulate(state.bubble_ratios.begin(), state.bubble_ratios.end(), 0.0) /
                      static_cast<double>(state.bubble_ratios.size());
  if (!compact) return BubbleSummary(state.bubble_ratios, state.num_ranks);
  const bool replicated = state.num_ranks > 0 && task >= state.num_ranks;
  return absl::StrFormat("%.2f/%.2f@%s", mean, *worst,
                         replicated ? absl::StrFormat("%dr%d", task / state.num_ranks,
                                                      task % state.num_ranks)
                                    : absl::StrCat("r", task));
}

}  // namespace

std::string StepLine(const WatchState& state) {
  if (!state.has_step) return "";
  const std::optional<absl::Duration> eta = EstimateRemaining(state);
  std::string line = absl::StrFormat(
      "step %d/%d  loss %s  %.0f samples/s  %.3fs/step  bubble %s  ETA %s", state.steps_done,
      state.steps_total, state.loss.has_value() ? absl::StrFormat("%.6f", *state.loss) : "-",
      state.samples_per_second, absl::ToDoubleSeconds(state.step_time), BubbleText(state, false),
      eta.has_value() ? FormatEta(*eta) : "-");
  // Coordinators that predate global steps leave it 0.
  if (state.global_step > state.steps_done - 1) {
    absl::StrAppend(&line, "  global ", state.global_step);
  }
  if (state.tokens_per_second > 0) {
    absl::StrAppend(&line, absl::StrFormat("  %.0f tokens/s  padding %.1f%%",
                                           state.tokens_per_second, 100 * state.padding_waste));
  }
  if (state.client_batch) absl::StrAppend(&line, "  (client batch)");
  if (state.learning_rate > 0) absl::StrAppend(&line, "  lr ", absl::StrFormat("%.4g", state.learning_rate));
  if (state.grad_norm.has_value()) {
    absl::StrAppend(&line, "  gnorm ", absl::StrFormat("%.4g", *state.grad_norm));
  }
  if (state.skipped) {
    absl::StrAppend(&line, "  SKIPPED (non-finite on rank ", absl::StrJoin(state.nonfinite_ranks, ","),
                    ")");
  }
  if (state.eval_loss.has_value()) {
    absl::StrAppend(&line, "  eval ", absl::StrFormat("%.4f", *state.eval_loss));
  }
  return line;
}

std::string ProgressLine(const WatchState& state, int width) {
  const size_t limit = static_cast<size_t>(std::max(width - 1, 1));
  if (!state.has_step) {
    std::string text = absl::StrCat(state.job_id, " ", StateName(state.state));
    if (text.size() > limit) text.resize(limit);
    return text;
  }
  const std::string suffix =
      state.state == v1::JOB_STATE_RUNNING ? "" : absl::StrCat("  ", StateName(state.state));
  std::string text = StepLine(state) + suffix;
  // The bar takes what the text leaves: 10 to 40 cells, plus its brackets and a space. When the
  // full text leaves less, a compact one is tried.
  constexpr int kMinCells = 10, kMaxCells = 40;
  auto room = [&](const std::string& t) {
    return static_cast<int>(limit) - static_cast<int>(t.size()) - 3;
  };
  if (room(text) < kMinCells) {
    const std::optional<absl::Duration> eta = EstimateRemaining(state);
    text = absl::StrFormat("%d/%d loss %s %.0f/s %.3fs/step bubble %s ETA %s%s", state.steps_done,
                           state.steps_total,
                           state.loss.has_value() ? absl::StrFormat("%.4f", *state.loss) : "-",
                           state.samples_per_second, absl::ToDoubleSeconds(state.step_time),
                           BubbleText(state, true), eta.has_value() ? FormatEta(*eta) : "-",
                           suffix);
  }
  std::string line;
  if (room(text) >= kMinCells) {
    const int cells = std::min(room(text), kMaxCells);
    const int64_t total = std::max<int64_t>(state.steps_total, 1);
    const int filled =
        static_cast<int>(cells * std::clamp<int64_t>(state.steps_done, 0, total) / total);
    line = absl::StrCat("[", std::string(filled, '#'), std::string(cells - filled, '.'), "] ");
  }
  line += text;
  if (line.size() > limit) line.resize(limit);
  return line;
}

std::string StateLine(const v1::JobTransition& transition, absl::TimeZone zone) {
  std::string line =
      absl::StrCat(absl::FormatTime("%H:%M:%S", rpc::FromProtoTimestamp(transition.time()), zone),
                   " ", StateName(transition.state()));
  if (!transition.reason().empty()) absl::StrAppend(&line, "  ", transition.reason());
  return line;
}

std::string ReplicaLostLine(const v1::JobEvent& event, absl::TimeZone zone) {
  const v1::ReplicaLost& lost = event.replica_lost();
  return absl::StrCat(absl::FormatTime("%H:%M:%S", rpc::FromProtoTimestamp(event.time()), zone),
                      " DEGRADED  replicas ", lost.healthy_replicas(), "/", lost.replicas(),
                      " healthy: replica ", lost.replica(), " left (", lost.reason(),
                      "); global step ", lost.retried_global_step(),
                      " runs again on the healthy ones");
}

std::string ReplicaHealedLine(const v1::JobEvent& event, absl::TimeZone zone) {
  const v1::ReplicaHealed& healed = event.replica_healed();
  return absl::StrFormat(
      "%s HEALED  replica %d rejoined at global step %d with replica %d's "
      "state (%d/%d healthy; degraded for %.1f s)",
      absl::FormatTime("%H:%M:%S", rpc::FromProtoTimestamp(event.time()), zone), healed.replica(),
      healed.joined_global_step(), healed.donor_replica(), healed.healthy_replicas(),
      healed.replicas(), healed.degraded_seconds());
}

std::string SnapshotTakenLine(const v1::JobEvent& event, absl::TimeZone zone) {
  const v1::SnapshotTaken& taken = event.snapshot_taken();
  return absl::StrCat(absl::FormatTime("%H:%M:%S", rpc::FromProtoTimestamp(event.time()), zone),
                      " SNAPSHOT  in memory after global step ", taken.global_step(), " (",
                      util::FormatBytes(static_cast<double>(taken.bytes())), ", ", taken.ranks(),
                      taken.ranks() == 1 ? " rank" : " ranks", ", each on ", taken.copies(),
                      taken.copies() == 1 ? " worker" : " workers", ")");
}

std::string NoticeLine(const v1::JobEvent& event, absl::TimeZone zone) {
  if (event.has_state_change()) return StateLine(event.state_change(), zone);
  if (event.has_replica_lost()) return ReplicaLostLine(event, zone);
  if (event.has_replica_healed()) return ReplicaHealedLine(event, zone);
  if (event.has_snapshot_taken()) return SnapshotTakenLine(event, zone);
  if (event.has_stalled() || event.has_stall_ended() || event.has_straggler()) {
    std::string line = DiagnosisEventLine(event, zone);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    return line;
  }
  return DroppedLine(event.events_dropped());
}

std::string DroppedLine(const v1::EventsDropped& dropped) {
  return absl::StrFormat(
      "(events %d..%d are no longer kept by the coordinator, which keeps a job's latest events; "
      "continuing from %d)",
      dropped.from_sequence(), dropped.to_sequence() - 1, dropped.to_sequence());
}

nlohmann::json EventJson(const v1::JobEvent& event) {
  nlohmann::json out;
  out["job_id"] = event.job_id();
  out["sequence"] = event.sequence();
  out["time"] = TimestampString(event.time());
  if (event.has_state_change()) {
    out["event"] = "state_change";
    out["state"] = StateName(event.state_change().state());
    out["reason"] = event.state_change().reason();
  } else if (event.has_step_completed()) {
    const v1::StepCompleted& step = event.step_completed();
    out["event"] = "step_completed";
    out["step"] = step.step();
    out["global_step"] = step.global_step();
    out["steps_total"] = step.steps_total();
    out["loss"] = step.has_loss() ? nlohmann::json(step.loss()) : nlohmann::json(nullptr);
    out["step_time_seconds"] = absl::ToDoubleSeconds(rpc::FromProtoDuration(step.step_time()));
    out["samples_per_second"] = step.samples_per_second();
    out["tokens_per_second"] = step.tokens_per_second();
    out["padding_waste"] = step.padding_waste();
    out["bubble_ratios"] =
        std::vector<double>(step.bubble_ratios().begin(), step.bubble_ratios().end());
    out["max_bubble_ratio"] =
        step.bubble_ratios().empty()
            ? 0.0
            : *std::max_element(step.bubble_ratios().begin(), step.bubble_ratios().end());
    out["client_batch"] = step.client_batch();
    out["learning_rate"] = step.learning_rate();
    out["grad_norm"] = step.has_grad_norm() ? nlohmann::json(step.grad_norm()) : nlohmann::json();
    out["skipped"] = step.skipped();
    out["nonfinite_ranks"] =
        std::vector<int>(step.nonfinite_ranks().begin(), step.nonfinite_ranks().end());
    if (step.has_eval_loss()) out["eval_loss"] = step.eval_loss();
    if (step.reduction_hidden_ratios_size() > 0) {
      out["reduction_hidden_ratios"] = std::vector<double>(step.reduction_hidden_ratios().begin(),
                                                           step.reduction_hidden_ratios().end());
    }
  } else if (event.has_replica_lost()) {
    const v1::ReplicaLost& lost = event.replica_lost();
    out["event"] = "replica_lost";
    out["replica"] = lost.replica();
    out["reason"] = lost.reason();
    out["healthy_replicas"] = lost.healthy_replicas();
    out["replicas"] = lost.replicas();
    out["retried_global_step"] = lost.retried_global_step();
    out["decided_after_seconds"] = lost.decided_after_seconds();
  } else if (event.has_replica_healed()) {
    const v1::ReplicaHealed& healed = event.replica_healed();
    out["event"] = "replica_healed";
    out["replica"] = healed.replica();
    out["donor_replica"] = healed.donor_replica();
    out["joined_global_step"] = healed.joined_global_step();
    out["healthy_replicas"] = healed.healthy_replicas();
    out["replicas"] = healed.replicas();
    out["degraded_seconds"] = healed.degraded_seconds();
  } else if (event.has_snapshot_taken()) {
    const v1::SnapshotTaken& taken = event.snapshot_taken();
    out["event"] = "snapshot_taken";
    out["global_step"] = taken.global_step();
    out["bytes"] = taken.bytes();
    out["ranks"] = taken.ranks();
    out["copies"] = taken.copies();
  } else if (event.has_stalled() || event.has_stall_ended() || event.has_straggler()) {
    for (auto& [key, value] : DiagnosisEventJson(event).items()) out[key] = value;
  } else if (event.has_events_dropped()) {
    out["event"] = "events_dropped";
    out["from_sequence"] = event.events_dropped().from_sequence();
    out["to_sequence"] = event.events_dropped().to_sequence();
  } else {
    out["event"] = "unknown";
  }
  return out;
}

}  // namespace stagecoach::client
