#include "common/schedule/memory_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/byte_size.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule {
namespace {

absl::Status CheckStageMemory(const StageMemory& m, const std::string& where) {
  for (const auto& [name, value] : {std::pair<const char*, double>{"parameters", m.parameters},
                                    {"gradients", m.gradients},
                                    {"optimizer_state", m.optimizer_state},
                                    {"activations", m.activations},
                                    {"weight_activations", m.weight_activations},
                                    {"backward_transient", m.backward_transient},
                                    {"forward_transient", m.forward_transient},
                                    {"weight_transient", m.weight_transient},
                                    {"weight_gradients", m.weight_gradients},
                                    {"output", m.output},
                                    {"gathered_parameters", m.gathered_parameters}}) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", name, " must be finite and >= 0, got ", value));
    }
  }
  if (m.weight_activations > m.activations) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".weight_activations (", m.weight_activations,
                     ") is more than its activations (", m.activations, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckInputs(const Simulation& sim, const std::vector<int>& stage_to_rank,
                         int num_stages, const MemoryModel& model) {
  if (num_stages < 1) return absl::InvalidArgumentError("num_stages must be >= 1");
  if (model.per_stage.size() > static_cast<size_t>(num_stages)) {
    return absl::InvalidArgumentError(absl::StrCat("memory.per_stage has ", model.per_stage.size(),
                                                   " entries for ", num_stages, " stages"));
  }
  if (stage_to_rank.size() != static_cast<size_t>(num_stages)) {
    return absl::InvalidArgumentError(absl::StrCat("stage_to_rank has ", stage_to_rank.size(),
                                                   " entries for ", num_stages, " stages"));
  }
  for (int s = 0; s < num_stages; ++s) {
    if (stage_to_rank[s] < 0 || stage_to_rank[s] >= static_cast<int>(sim.timeline.size())) {
      return absl::InvalidArgumentError(absl::StrCat("stage_to_rank[", s, "] = ", stage_to_rank[s],
                                                     " is not one of the simulation's ",
                                                     sim.timeline.size(), " ranks"));
    }
  }
  RETURN_IF_ERROR(CheckStageMemory(model.defaults, "memory.defaults"));
  for (size_t s = 0; s < model.per_stage.size(); ++s) {
    RETURN_IF_ERROR(
        CheckStageMemory(model.per_stage[s], absl::StrCat("memory.per_stage[", s, "]")));
  }
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    for (const TimedAction& t : sim.timeline[r]) {
      for (const Action* leaf : LeafActions(t.action)) {
        if (leaf->stage < 0 || leaf->stage >= num_stages) {
          return absl::InvalidArgumentError(absl::StrCat("rank ", r, "'s ", t.action.ToString(),
                                                         " names a stage outside [0, ", num_stages,
                                                         ")"));
        }
      }
    }
  }
  return absl::OkStatus();
}

// Replays one rank's timeline.
class RankReplay {
 public:
  RankReplay(const std::vector<StageMemory>& stages, const std::vector<int>& stage_to_rank,
             int rank)
      : stages_(stages), stage_to_rank_(stage_to_rank), rank_(rank) {
    result_.curve.push_back({0, 0});
  }

  // Frees `bytes` at `time`, when a SEND_B of this rank has arrived.
  void FreeOnArrival(double time, double bytes) { arrivals_.emplace_back(time, bytes); }

  RankMemory Run(const std::vector<TimedAction>& timeline) {
    std::sort(arrivals_.begin(), arrivals_.end());
    for (const TimedAction& t : timeline) {
      ApplyArrivals(t.start);
      switch (t.action.type) {
        case ActionType::kRecvF:
          Buffer(recv_f_, t.action, Output(t.action.stage - 1), t.start);
          break;
        case ActionType::kRecvB:
          Buffer(recv_b_, t.action, Output(t.action.stage), t.start);
          break;
        case ActionType::kSendF:
        case ActionType::kSendB:
          break;
        case ActionType::kUnshard:
          Change(t.start, stages_[t.action.stage].gathered_parameters, t.action);
          break;
        case ActionType::kReshard:
          Change(t.end, -stages_[t.action.stage].gathered_parameters, t.action);
          break;
        case ActionType::kReduceGrad: {
          const StageMemory& m = stages_[t.action.stage];
          if (m.gradients_freed_at_reduce && stages_with_gradients_.count(t.action.stage) > 0) {
            Change(t.end, -m.gradients, t.action);
          }
          break;
        }
        default:
          RunCompute(t);
      }
    }
    ApplyArrivals(std::numeric_limits<double>::infinity());
    return std::move(result_);
  }

 private:
  using Key = std::pair<int, int>;  // stage, microbatch

  double Output(int stage) const { return stage >= 0 ? stages_[stage].output : 0.0; }

  void ApplyArrivals(double until) {
    while (next_arrival_ < arrivals_.size() && arrivals_[next_arrival_].first <= until) {
      const auto& [time, bytes] = arrivals_[next_arrival_++];
      live_ -= bytes;
      Point(time, live_);
    }
  }

  // `bytes` allocated (or, negative, freed) at `time` by `action`.
  void Change(double time, double bytes, const Action& action) {
    if (bytes == 0) return;
    live_ += bytes;
    Point(time, live_);
    if (bytes > 0) Candidate(live_, held_, time, action);
  }

  void Buffer(std::map<Key, double>& buffers, const Action& recv, double bytes, double time) {
    buffers[{recv.stage, *recv.microbatch}] = bytes;
    live_ += bytes;
    Point(time, live_);
    Candidate(live_, held_, time, recv);
  }

  static double Take(std::map<Key, double>& buffers, const Key& key) {
    auto it = buffers.find(key);
    if (it == buffers.end()) return 0;
    const double bytes = it->second;
    buffers.erase(it);
    return bytes;
  }

  // A compute entry: its leaves one after another; the peak candidate at its start, the
  // changes at its end.
  void RunCompute(const TimedAction& t) {
    double net = 0;
    int held = 0;
    double highest = 0;
    int held_at_highest = 0;
    for (const Action* leaf : LeafActions(t.action)) {
      const int s = leaf->stage;
      const StageMemory& m = stages_[s];
      const Key key{s, leaf->microbatch.value_or(0)};
      // While the leaf runs, what the earlier leaves left (net) plus what it builds (`during`).
      double during = 0;
      int held_during = held;
      switch (leaf->type) {
        case ActionType::kForward:
          during = m.activations;
          net += m.activations;
          held_during = ++held;
          break;
        case ActionType::kBackwardInput:
          if (s == 0) {
            // The first stage's input is the data: I has no input path and computes nothing;
            // W runs the whole backward from the output gradient, which it keeps until then.
            weight_inputs_[key] = Take(recv_b_, key) + Take(handed_, key);
            break;
          }
          [[fallthrough]];
        case ActionType::kFullBackward: {
          const bool full = leaf->type == ActionType::kFullBackward;
          const double input_grad = Output(s - 1);
          // I computes what W will need (weight_gradients) layer by layer and holds it all to
          // its end, beside the activations it frees only as it goes.
          during = (full ? m.backward_transient
                         : std::max(0.0, m.backward_transient - m.weight_transient) +
                               m.weight_gradients) +
                   input_grad;
          const double base = net;
          const double input = Take(recv_f_, key);
          net += input_grad + (full ? 0.0 : m.weight_gradients) -
                 (full ? m.activations : m.activations - m.weight_activations) -
                 (full ? input : 0.0) - Take(recv_b_, key) - Take(handed_, key);
          if (!full && input > 0) weight_inputs_[key] = input;
          during += base;
          if (full) --held;
          if (s > 0 && stage_to_rank_[s - 1] == rank_) handed_[{s - 1, key.second}] = input_grad;
          break;
        }
        case ActionType::kBackwardWeight:
          if (s == 0) {  // the whole backward, as B (see kBackwardInput)
            during = net + m.backward_transient;
            net -= m.activations + Take(weight_inputs_, key);
          } else {
            during = net + m.weight_transient;
            net -= m.weight_activations + m.weight_gradients + Take(weight_inputs_, key);
          }
          --held;
          break;
        default:
          break;
      }
      // The stage's first weight gradients of the step allocate its gradient buffers, which
      // stay until the step ends (the next step starts without them). B (W) allocates them
      // layer by layer while it frees, layer by layer, the activations (the weight
      // activations) it consumes, since autograd drops saved tensors as it goes: its peak grows
      // only by what the gradients exceed those by.
      if ((leaf->type == ActionType::kFullBackward || leaf->type == ActionType::kBackwardWeight) &&
          stages_with_gradients_.insert(s).second) {
        const double consumed = leaf->type == ActionType::kFullBackward || s == 0
                                    ? m.activations
                                    : m.weight_activations;
        during += std::max(0.0, m.gradients - consumed);
        net += m.gradients;
      }
      if (leaf->type == ActionType::kForward) during = net + m.forward_transient;
      if (during > highest) {
        highest = during;
        held_at_highest = held_during;
      }
    }
    if (highest > 0) Point(t.start, live_ + highest);
    Candidate(live_ + highest, held_ + held_at_highest, t.start, t.action);
    ApplyArrivals(t.end);
    live_ += net;
    held_ += held;
    Point(t.end, live_);
  }

  void Point(double time, double bytes) {
    std::vector<MemoryPoint>& curve = result_.curve;
    if (!curve.empty() && curve.back().time == time) {
      curve.back().bytes = bytes;
    } else if (curve.empty() || curve.back().bytes != bytes) {
      curve.push_back({time, bytes});
    }
  }

  void Candidate(double bytes, int held, double time, const Action& action) {
    if (bytes > result_.peak_dynamic) {
      result_.peak_dynamic = bytes;
      result_.peak_time = time;
      result_.peak_action = action.ToString();
      result_.peak_microbatches = held;
    }
  }

  const std::vector<StageMemory>& stages_;
  const std::vector<int>& stage_to_rank_;
  const int rank_;
  std::vector<std::pair<double, double>> arrivals_;  // (time, bytes freed)
  size_t next_arrival_ = 0;
  std::map<Key, double> recv_f_;         // received inputs, until the backward
  std::map<Key, double> recv_b_;         // received output gradients, until the backward
  std::map<Key, double> handed_;         // output gradients from a stage on this rank
  std::map<Key, double> weight_inputs_;  // received inputs I left for W
  std::set<int> stages_with_gradients_;  // stages whose gradient buffers exist
  double live_ = 0;
  int held_ = 0;  // (stage, microbatch) activations held
  RankMemory result_;
};

}  // namespace

double OptimizerStateBytes(OptimizerKind kind, double parameter_bytes, int shards) {
  double buffers = 0;
  switch (kind) {
    case OptimizerKind::kSgd:
      buffers = 0;
      break;
    case OptimizerKind::kSgdMomentum:
      buffers = 1;
      break;
    case OptimizerKind::kAdamW:
      buffers = 2;
      break;
  }
  return std::ceil(buffers * parameter_bytes / std::max(shards, 1));
}

absl::StatusOr<MemoryProfile> SimulateMemory(const Simulation& simulation,
                                             const std::vector<int>& stage_to_rank, int num_stages,
                                             const MemoryModel& model) {
  RETURN_IF_ERROR(CheckInputs(simulation, stage_to_rank, num_stages, model));
  std::vector<StageMemory> stages(num_stages, model.defaults);
  std::copy(model.per_stage.begin(), model.per_stage.end(), stages.begin());

  const int num_ranks = static_cast<int>(simulation.timeline.size());
  std::vector<RankReplay> replays;
  replays.reserve(num_ranks);
  for (int r = 0; r < num_ranks; ++r) replays.emplace_back(stages, stage_to_rank, r);
  for (const Message& m : simulation.messages) {
    if (m.send.type != ActionType::kSendB || m.from_rank < 0 || m.from_rank >= num_ranks) continue;
    if (m.send.stage < 1 || m.send.stage >= num_stages) continue;
    const std::vector<TimedAction>& timeline = simulation.timeline[m.from_rank];
    const double freed = model.gradient_sends_held_to_step_end && !timeline.empty()
                             ? std::max(m.arrive, timeline.back().end)
                             : m.arrive;
    replays[m.from_rank].FreeOnArrival(freed, stages[m.send.stage - 1].output);
  }
  MemoryProfile profile;
  profile.ranks.reserve(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    RankMemory rank = replays[r].Run(simulation.timeline[r]);
    for (int s = 0; s < num_stages; ++s) {
      if (stage_to_rank[s] != r) continue;
      rank.static_bytes += stages[s].parameters + stages[s].optimizer_state;
    }
    rank.peak_total = rank.static_bytes + rank.peak_dynamic;
    profile.ranks.push_back(std::move(rank));
  }
  return profile;
}

std::string FormatMemory(const MemoryProfile& profile) {
  std::string out = absl::StrFormat("%6s %12s %12s %12s %10s %10s %6s\n", "rank", "static",
                                    "peak dyn", "peak total", "at", "action", "held");
  for (size_t r = 0; r < profile.ranks.size(); ++r) {
    const RankMemory& m = profile.ranks[r];
    absl::StrAppendFormat(&out, "%6d %12s %12s %12s %10g %10s %6d\n", r,
                          util::FormatBytes(m.static_bytes), util::FormatBytes(m.peak_dynamic),
                          util::FormatBytes(m.peak_total), m.peak_time,
                          m.peak_action.empty() ? "-" : m.peak_action, m.peak_microbatches);
  }
  return out;
}

}  // namespace stagecoach::schedule
