#include "common/schedule/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/schedule/simulator_checks.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule {
namespace {

using simulator_internal::AtStep;

// ---------------------------------------------------------------------------------------------
// The simulation.

// What each (stage, microbatch) has run so far.
enum DoneBits : uint8_t { kDoneF = 1, kDoneI = 2, kDoneW = 4, kDoneB = 8 };

constexpr double kNotYet = -1;  // times are >= 0

class Simulator {
 public:
  Simulator(const PipelineOrder& lowered, const std::vector<int>& stage_to_rank, int num_stages,
            int num_microbatches, const CostModel& costs)
      : lowered_(lowered),
        stage_to_rank_(stage_to_rank),
        num_stages_(num_stages),
        num_microbatches_(num_microbatches),
        costs_(costs),
        stage_costs_(num_stages, costs.defaults),
        message_bytes_(num_stages, costs.message_bytes),
        unshard_(num_stages, costs.unshard),
        reduce_grad_(num_stages, costs.reduce_grad),
        gathered_at_(num_stages, 0),
        ranks_(lowered.size()),
        done_(static_cast<size_t>(num_stages) * num_microbatches, 0),
        slots_(2 * static_cast<size_t>(num_stages) * num_microbatches),
        live_(num_stages, 0),
        peak_(num_stages, 0) {
    std::copy(costs.per_stage.begin(), costs.per_stage.end(), stage_costs_.begin());
    std::copy(costs.per_stage_message_bytes.begin(), costs.per_stage_message_bytes.end(),
              message_bytes_.begin());
    std::copy(costs.per_stage_unshard.begin(), costs.per_stage_unshard.end(), unshard_.begin());
    std::copy(costs.per_stage_reduce_grad.begin(), costs.per_stage_reduce_grad.end(),
              reduce_grad_.begin());
    timeline_.resize(lowered.size());
    busy_.assign(lowered.size(), 0);
    for (size_t rank = 0; rank < lowered.size(); ++rank) {
      timeline_[rank].reserve(lowered[rank].size());
    }
  }

  absl::StatusOr<Simulation> Run() {
    for (size_t rank = 0; rank < ranks_.size(); ++rank) Enqueue(rank);
    while (!queue_.empty()) {
      const size_t rank = queue_.front();
      queue_.pop_front();
      ranks_[rank].queued = false;
      RETURN_IF_ERROR(Advance(rank));
    }
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      if (!Finished(rank)) return Deadlock();
    }
    RETURN_IF_ERROR(CheckAllMatched());
    return Finish();
  }

 private:
  // Why a rank cannot run its next entry.
  struct Wait {
    const Action* leaf = nullptr;  // the leaf that waits
    int slot = -1;                 // the message it waits for; -1: a producer on this rank
  };

  struct RankState {
    size_t next = 0;        // index of the next entry in the rank's list
    double clock = 0;       // when the rank is free
    double queue_free = 0;  // overlap_collectives: when its communication queue is free
    std::optional<Wait> wait;
    bool queued = false;
  };

  // One message, indexed by direction, sending stage and microbatch.
  struct Slot {
    double posted_send = kNotYet;
    double posted_recv = kNotYet;
    double arrive = kNotYet;
    size_t send_index = 0;  // position of the SEND in its rank's timeline
  };

  // Messages of SEND_F(stage, mb) / SEND_B(stage, mb).
  int ForwardSlot(int sending_stage, int mb) const {
    return sending_stage * num_microbatches_ + mb;
  }
  int BackwardSlot(int sending_stage, int mb) const {
    return (num_stages_ + sending_stage) * num_microbatches_ + mb;
  }
  bool IsForwardSlot(int slot) const { return slot < num_stages_ * num_microbatches_; }
  int SlotStage(int slot) const { return (slot / num_microbatches_) % num_stages_; }
  int SlotMicrobatch(int slot) const { return slot % num_microbatches_; }

  uint8_t& Done(int stage, int mb) {
    return done_[static_cast<size_t>(stage) * num_microbatches_ + mb];
  }
  bool IsLocal(size_t rank, int stage) const {
    return stage_to_rank_[stage] == static_cast<int>(rank);
  }
  bool Finished(size_t rank) const { return ranks_[rank].next >= lowered_[rank].size(); }

  void Enqueue(size_t rank) {
    if (ranks_[rank].queued) return;
    ranks_[rank].queued = true;
    queue_.push_back(rank);
  }

  // Runs `rank`'s list until it ends or an entry has to wait for another rank.
  absl::Status Advance(size_t rank) {
    RankState& state = ranks_[rank];
    state.wait.reset();
    const RankActions& list = lowered_[rank];
    while (state.next < list.size()) {
      if (!list[state.next].has_value()) {
        ++state.next;
        continue;
      }
      const Action& entry = *list[state.next];
      ASSIGN_OR_RETURN(std::optional<Wait> wait, FindWait(rank, entry));
      if (wait.has_value()) {
        state.wait = wait;
        return absl::OkStatus();
      }
      RETURN_IF_ERROR(Execute(rank, entry));
      ++state.next;
    }
    return absl::OkStatus();
  }

  // The first leaf of `entry` whose input is not known yet, or nullopt if it can run. A leaf may
  // consume what an earlier leaf of the same entry produces.
  absl::StatusOr<std::optional<Wait>> FindWait(size_t rank, const Action& entry) {
    const LeafRange leaves = LeafActions(entry);
    for (size_t i = 0; i < leaves.size(); ++i) {
      const Action& leaf = *leaves[i];
      const int s = leaf.stage;
      const int mb = leaf.microbatch.value_or(0);
      auto earlier = [&](int stage, uint8_t bits) {
        if (Done(stage, mb) & bits) return true;
        for (size_t k = 0; k < i; ++k) {
          if (leaves[k]->stage == stage && *leaves[k]->microbatch == mb &&
              (BitOf(leaves[k]->type) & bits)) {
            return true;
          }
        }
        return false;
      };
      std::optional<int> slot;
      if (leaf.type == ActionType::kForward && s > 0) {
        if (IsLocal(rank, s - 1)) {
          if (!earlier(s - 1, kDoneF)) return Wait{&leaf, -1};
          continue;
        }
        slot = ForwardSlot(s - 1, mb);
      } else if (IsBackwardInputOrFull(leaf.type) && s < num_stages_ - 1) {
        if (IsLocal(rank, s + 1)) {
          if (!earlier(s + 1, kDoneI | kDoneB)) return Wait{&leaf, -1};
          continue;
        }
        slot = BackwardSlot(s + 1, mb);
      } else {
        continue;
      }
      if (slots_[*slot].posted_recv == kNotYet) {
        return AtStep(rank, ranks_[rank].next,
                      absl::StrCat(DescribeLeaf(leaf, entry), " consumes a tensor from rank ",
                                   stage_to_rank_[SlotStage(*slot)], " but its ",
                                   RecvOf(*slot).ToString(), " was not posted before it"));
      }
      if (slots_[*slot].arrive == kNotYet) return Wait{&leaf, *slot};
    }
    return std::nullopt;
  }

  static uint8_t BitOf(ActionType type) {
    switch (type) {
      case ActionType::kForward:
        return kDoneF;
      case ActionType::kBackwardInput:
        return kDoneI;
      case ActionType::kBackwardWeight:
        return kDoneW;
      case ActionType::kFullBackward:
        return kDoneB;
      default:
        return 0;
    }
  }

  Action SendOf(int slot) const {
    return Action::Make(SlotStage(slot),
                        IsForwardSlot(slot) ? ActionType::kSendF : ActionType::kSendB,
                        SlotMicrobatch(slot));
  }
  Action RecvOf(int slot) const {
    const bool forward = IsForwardSlot(slot);
    return Action::Make(SlotStage(slot) + (forward ? 1 : -1),
                        forward ? ActionType::kRecvF : ActionType::kRecvB, SlotMicrobatch(slot));
  }

  // When the input of `leaf` (whose producer has run or whose message has arrived) is available.
  double InputReady(size_t rank, const Action& leaf) const {
    const int s = leaf.stage;
    const int mb = leaf.microbatch.value_or(0);
    if (leaf.type == ActionType::kForward && s > 0 && !IsLocal(rank, s - 1)) {
      return slots_[ForwardSlot(s - 1, mb)].arrive;
    }
    if (IsBackwardInputOrFull(leaf.type) && s < num_stages_ - 1 && !IsLocal(rank, s + 1)) {
      return slots_[BackwardSlot(s + 1, mb)].arrive;
    }
    return 0;  // no input, or a local producer that ran earlier on this rank's clock
  }

  double LeafCost(const Action& leaf) const {
    const StageCosts& c = stage_costs_[leaf.stage];
    switch (leaf.type) {
      case ActionType::kForward:
        return c.forward;
      case ActionType::kBackwardInput:
        return c.backward_input;
      case ActionType::kBackwardWeight:
        return c.backward_weight;
      case ActionType::kFullBackward:
        return c.backward;
      case ActionType::kUnshard:
        return unshard_[leaf.stage];
      case ActionType::kReshard:
        return costs_.reshard;
      case ActionType::kReduceGrad:
        return reduce_grad_[leaf.stage];
      default:
        return 0;
    }
  }

  absl::Status Execute(size_t rank, const Action& entry) {
    RankState& state = ranks_[rank];
    switch (entry.type) {
      case ActionType::kSendF:
      case ActionType::kSendB:
        RETURN_IF_ERROR(PostSend(rank, entry));
        timeline_[rank].push_back({entry, state.clock, state.clock});
        return absl::OkStatus();
      case ActionType::kRecvF:
      case ActionType::kRecvB:
        RETURN_IF_ERROR(PostRecv(rank, entry));
        timeline_[rank].push_back({entry, state.clock, state.clock});
        return absl::OkStatus();
      default:
        return RunCompute(rank, entry);
    }
  }

  // Runs a compute entry (F, I, W, B, OVERLAP_F_B) or UNSHARD / RESHARD / REDUCE_GRAD.
  absl::Status RunCompute(size_t rank, const Action& entry) {
    RankState& state = ranks_[rank];
    if (costs_.overlap_collectives &&
        (entry.type == ActionType::kUnshard || entry.type == ActionType::kReduceGrad)) {
      // Queued: the collective runs on the communication queue.
      state.queue_free = std::max(state.clock, state.queue_free) + LeafCost(entry);
      if (entry.type == ActionType::kUnshard) gathered_at_[entry.stage] = state.queue_free;
      timeline_[rank].push_back({entry, state.clock, state.clock});
      return absl::OkStatus();
    }
    std::optional<double> start;
    double t = state.clock;
    for (const Action* leaf : LeafActions(entry)) {
      double leaf_start = std::max(t, InputReady(rank, *leaf));
      if (costs_.overlap_collectives &&
          (IsLeafCompute(leaf->type) || leaf->type == ActionType::kReshard)) {
        leaf_start = std::max(leaf_start, gathered_at_[leaf->stage]);
      }
      if (!start.has_value()) start = leaf_start;
      const double cost = LeafCost(*leaf);
      t = leaf_start + cost;
      busy_[rank] += cost;
      RETURN_IF_ERROR(Complete(rank, *leaf, entry));
    }
    timeline_[rank].push_back({entry, start.value_or(t), t});
    state.clock = t;
    return absl::OkStatus();
  }

  // Records that `leaf` has run: its (stage, mb) bits and the stage's live activations.
  absl::Status Complete(size_t rank, const Action& leaf, const Action& entry) {
    if (!IsLeafCompute(leaf.type)) return absl::OkStatus();
    const int s = leaf.stage;
    const int mb = *leaf.microbatch;
    uint8_t& done = Done(s, mb);
    const uint8_t bit = BitOf(leaf.type);
    auto fail = [&](auto&&... parts) {
      return AtStep(rank, ranks_[rank].next, absl::StrCat(DescribeLeaf(leaf, entry), parts...));
    };
    if (done & bit) return fail(" runs a second time");
    if ((leaf.type == ActionType::kBackwardInput || leaf.type == ActionType::kFullBackward) &&
        !(done & kDoneF)) {
      return fail(" runs before ", Action::Make(s, ActionType::kForward, mb).ToString());
    }
    if ((leaf.type == ActionType::kBackwardInput && (done & kDoneB)) ||
        (leaf.type == ActionType::kFullBackward && (done & kDoneI))) {
      return fail(" runs although stage ", s, ", microbatch ", mb,
                  " already has a backward of the other kind (B vs. I/W)");
    }
    if (leaf.type == ActionType::kBackwardWeight && !(done & kDoneI)) {
      return fail(" runs before ", Action::Make(s, ActionType::kBackwardInput, mb).ToString());
    }
    done |= bit;
    if (leaf.type == ActionType::kForward) {
      peak_[s] = std::max(peak_[s], ++live_[s]);
    } else if (leaf.type == ActionType::kFullBackward || leaf.type == ActionType::kBackwardWeight) {
      --live_[s];
    }
    return absl::OkStatus();
  }

  absl::Status PostSend(size_t rank, const Action& send) {
    const int s = send.stage;
    const int mb = *send.microbatch;
    const bool forward = send.type == ActionType::kSendF;
    const uint8_t produced = forward ? kDoneF : (kDoneI | kDoneB);
    if (!(Done(s, mb) & produced)) {
      const std::string producer =
          forward ? Action::Make(s, ActionType::kForward, mb).ToString()
                  : absl::StrCat(Action::Make(s, ActionType::kBackwardInput, mb).ToString(), " or ",
                                 Action::Make(s, ActionType::kFullBackward, mb).ToString());
      return AtStep(rank, ranks_[rank].next,
                    absl::StrCat(send.ToString(), " comes before ", producer,
                                 ", which produces what it sends"));
    }
    const int slot = forward ? ForwardSlot(s, mb) : BackwardSlot(s, mb);
    Slot& message = slots_[slot];
    if (message.posted_send != kNotYet) {
      return AtStep(rank, ranks_[rank].next, absl::StrCat(send.ToString(), " is posted twice"));
    }
    message.posted_send = ranks_[rank].clock;
    message.send_index = timeline_[rank].size();
    if (message.posted_recv != kNotYet) Match(slot);
    return absl::OkStatus();
  }

  absl::Status PostRecv(size_t rank, const Action& recv) {
    const int s = recv.stage;
    const int mb = *recv.microbatch;
    const int slot =
        recv.type == ActionType::kRecvF ? ForwardSlot(s - 1, mb) : BackwardSlot(s + 1, mb);
    Slot& message = slots_[slot];
    if (message.posted_recv != kNotYet) {
      return AtStep(rank, ranks_[rank].next, absl::StrCat(recv.ToString(), " is posted twice"));
    }
    message.posted_recv = ranks_[rank].clock;
    if (message.posted_send != kNotYet) Match(slot);
    return absl::OkStatus();
  }

  // Both ends of `slot` are posted: starts the transfer and wakes the receiver if it waits for it.
  void Match(int slot) {
    Slot& message = slots_[slot];
    const int sending_stage = SlotStage(slot);
    const double bytes = message_bytes_[sending_stage];
    const double start = std::max(message.posted_send, message.posted_recv);
    message.arrive =
        start + costs_.latency + (costs_.bandwidth > 0 ? bytes / costs_.bandwidth : 0.0);
    const Action recv = RecvOf(slot);
    const int to_rank = stage_to_rank_[recv.stage];
    messages_.push_back({SendOf(slot), recv, stage_to_rank_[sending_stage], to_rank,
                         message.posted_send, message.posted_recv, start, message.arrive, bytes});
    message_order_.push_back(message.send_index);
    const std::optional<Wait>& wait = ranks_[to_rank].wait;
    if (wait.has_value() && wait->slot == slot) Enqueue(to_rank);
  }

  absl::Status Deadlock() const {
    std::vector<std::string> lines;
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      const RankState& state = ranks_[rank];
      if (Finished(rank)) {
        lines.push_back(absl::StrCat("rank ", rank, " has finished"));
        continue;
      }
      const Action& entry = *lowered_[rank][state.next];
      lines.push_back(absl::StrCat("rank ", rank, " is blocked at step ", state.next, " on ",
                                   DescribeLeaf(*state.wait->leaf, entry), ", waiting for ",
                                   WaitingFor(*state.wait)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("deadlock: no rank can progress; ", absl::StrJoin(lines, "; ")));
  }

  std::string WaitingFor(const Wait& wait) const {
    if (wait.slot >= 0) {
      return absl::StrCat(SendOf(wait.slot).ToString(), " from rank ",
                          stage_to_rank_[SlotStage(wait.slot)]);
    }
    const Action& leaf = *wait.leaf;
    const int mb = *leaf.microbatch;
    if (leaf.type == ActionType::kForward) {
      return absl::StrCat(Action::Make(leaf.stage - 1, ActionType::kForward, mb).ToString(),
                          " on this rank");
    }
    return absl::StrCat(
        Action::Make(leaf.stage + 1, ActionType::kBackwardInput, mb).ToString(), " or ",
        Action::Make(leaf.stage + 1, ActionType::kFullBackward, mb).ToString(), " on this rank");
  }

  absl::Status CheckAllMatched() const {
    for (int slot = 0; slot < static_cast<int>(slots_.size()); ++slot) {
      const Slot& message = slots_[slot];
      const Action send = SendOf(slot);
      const Action recv = RecvOf(slot);
      if (message.posted_send != kNotYet && message.posted_recv == kNotYet) {
        return absl::InvalidArgumentError(absl::StrCat(
            send.ToString(), " on rank ", stage_to_rank_[send.stage], " has no matching ",
            recv.ToString(), " on rank ", stage_to_rank_[recv.stage]));
      }
      if (message.posted_recv != kNotYet && message.posted_send == kNotYet) {
        return absl::InvalidArgumentError(absl::StrCat(
            recv.ToString(), " on rank ", stage_to_rank_[recv.stage], " has no matching ",
            send.ToString(), " on rank ", stage_to_rank_[send.stage]));
      }
    }
    return absl::OkStatus();
  }

  Simulation Finish() {
    Simulation sim;
    std::vector<double> after_step(ranks_.size(), 0);
    for (size_t s = 0; s < costs_.per_stage_after_step.size(); ++s) {
      after_step[stage_to_rank_[s]] += costs_.per_stage_after_step[s];
    }
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      const RankState& state = ranks_[rank];
      sim.makespan =
          std::max(sim.makespan, std::max(state.clock, state.queue_free) + after_step[rank]);
    }
    sim.timeline = std::move(timeline_);
    sim.messages = SortedMessages();
    sim.busy = busy_;
    sim.bubble_ratio.reserve(busy_.size());
    for (double busy : busy_) {
      sim.bubble_ratio.push_back(sim.makespan > 0 ? 1 - busy / sim.makespan : 0.0);
    }
    sim.peak_activations = peak_;
    return sim;
  }

  // messages_ ordered by (start, from_rank, position of the SEND in the sender's timeline).
  std::vector<Message> SortedMessages() {
    std::vector<size_t> order(messages_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_tuple(messages_[a].start, messages_[a].from_rank, message_order_[a]) <
             std::make_tuple(messages_[b].start, messages_[b].from_rank, message_order_[b]);
    });
    std::vector<Message> sorted;
    sorted.reserve(messages_.size());
    for (size_t i : order) sorted.push_back(std::move(messages_[i]));
    return sorted;
  }

  const PipelineOrder& lowered_;
  const std::vector<int>& stage_to_rank_;
  const int num_stages_;
  const int num_microbatches_;
  const CostModel& costs_;
  std::vector<StageCosts> stage_costs_;  // per stage, overrides applied
  std::vector<double> message_bytes_;    // per sending stage, overrides applied
  std::vector<double> unshard_;          // per stage, overrides applied
  std::vector<double> reduce_grad_;      // per stage, overrides applied
  std::vector<double> gathered_at_;      // per stage: when its latest all-gather ends
  std::vector<RankState> ranks_;
  std::deque<size_t> queue_;   // ranks that may be able to progress
  std::vector<uint8_t> done_;  // DoneBits per (stage, mb)
  std::vector<Slot> slots_;    // per message
  std::vector<int> live_;      // per stage: activations held now
  std::vector<int> peak_;      // per stage: most activations held at once
  std::vector<std::vector<TimedAction>> timeline_;
  std::vector<double> busy_;
  std::vector<Message> messages_;      // in the order they were matched
  std::vector<size_t> message_order_;  // per message: its SEND's index in the sender's timeline
};

}  // namespace

absl::StatusOr<Simulation> Simulate(const PipelineOrder& lowered,
                                    const std::vector<int>& stage_to_rank, int num_stages,
                                    int num_microbatches, const CostModel& costs) {
  RETURN_IF_ERROR(
      simulator_internal::CheckShape(lowered, stage_to_rank, num_stages, num_microbatches));
  RETURN_IF_ERROR(simulator_internal::CheckCostModel(costs, num_stages));
  RETURN_IF_ERROR(simulator_internal::CheckActions(lowered, stage_to_rank, num_microbatches));
  return Simulator(lowered, stage_to_rank, num_stages, num_microbatches, costs).Run();
}

std::string FormatTimeline(const Simulation& simulation) {
  std::string out = absl::StrFormat("makespan %g\n", simulation.makespan);
  absl::StrAppendFormat(&out, "%6s %12s %8s\n", "rank", "busy", "bubble");
  for (size_t rank = 0; rank < simulation.busy.size(); ++rank) {
    const double bubble = rank < simulation.bubble_ratio.size() ? simulation.bubble_ratio[rank] : 0;
    absl::StrAppendFormat(&out, "%6d %12g %7.1f%%\n", rank, simulation.busy[rank], 100 * bubble);
  }
  absl::StrAppendFormat(&out, "%6s %12s\n", "stage", "peak acts");
  for (size_t stage = 0; stage < simulation.peak_activations.size(); ++stage) {
    absl::StrAppendFormat(&out, "%6d %12d\n", stage, simulation.peak_activations[stage]);
  }
  return out;
}

}  // namespace stagecoach::schedule
