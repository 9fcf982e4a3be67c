// The schedule IR: one action of one rank, written exactly as torch.distributed.pipelining
// writes it: "{stage}{type}{microbatch}" ("2F0", "1SEND_B3"), "{stage}{type}" for the per-stage
// actions ("1UNSHARD", "0REDUCE_GRAD"), and "({a};{b})OVERLAP_F_B" for an overlapped pair.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::schedule {

// PyTorch's _ComputationType. The string form of each is given by ActionTypeName().
enum class ActionType {
  kForward,         // "F"
  kBackwardInput,   // "I": gradient w.r.t. the stage input only
  kBackwardWeight,  // "W": gradient w.r.t. the stage weights, after its I
  kFullBackward,    // "B": I and W together
  kUnshard,         // "UNSHARD"
  kReshard,         // "RESHARD"
  kSendF,           // "SEND_F": send the forward output of (stage, mb) to the next stage
  kRecvF,           // "RECV_F": receive the forward input of (stage, mb) from the previous stage
  kSendB,           // "SEND_B": send the input gradient of (stage, mb) to the previous stage
  kRecvB,           // "RECV_B": receive the output gradient of (stage, mb) from the next stage
  kReduceGrad,      // "REDUCE_GRAD": the stage's gradients are complete; scale / reduce them
  kOverlapFB,       // "OVERLAP_F_B": a container of sub-actions run together
};

// The exact string PyTorch uses for `type` ("F", "SEND_F", ...).
absl::string_view ActionTypeName(ActionType type);

// True for F, I, W, B and OVERLAP_F_B (PyTorch's is_compute_op).
bool IsCompute(ActionType type);

// True for the types that carry a microbatch index (F, I, W, B, SEND_*, RECV_*).
bool HasMicrobatch(ActionType type);

struct Action {
  // Pipeline stage. -1 for OVERLAP_F_B containers (their sub-actions carry the stages).
  int stage = 0;
  ActionType type = ActionType::kForward;
  // Set exactly when HasMicrobatch(type).
  std::optional<int> microbatch;
  // Only for OVERLAP_F_B: the overlapped actions, in order.
  std::vector<Action> sub_actions;

  static Action Make(int stage, ActionType type, std::optional<int> microbatch = std::nullopt) {
    return Action{stage, type, microbatch, {}};
  }

  // PyTorch's repr: "2F0", "1UNSHARD", "(0F7;7B3)OVERLAP_F_B".
  std::string ToString() const;

  friend bool operator==(const Action& a, const Action& b) {
    return a.stage == b.stage && a.type == b.type && a.microbatch == b.microbatch &&
           a.sub_actions == b.sub_actions;
  }
  friend bool operator!=(const Action& a, const Action& b) { return !(a == b); }
  friend bool operator<(const Action& a, const Action& b);
};

std::ostream& operator<<(std::ostream& os, const Action& action);

// Parses one action. Surrounding whitespace is ignored; "" (or only whitespace) is an idle slot
// and parses to std::nullopt. Stricter than PyTorch: trailing characters ("2F0xyz"), a missing
// or superfluous index ("2F", "1UNSHARD3"), an index over 9 digits ("too large"), nested or
// non-OVERLAP_F_B containers ("(0F1;1B0)B") are INVALID_ARGUMENT errors that quote the string.
absl::StatusOr<std::optional<Action>> ParseAction(absl::string_view text);

// Like ParseAction, but an idle slot is an error too.
absl::StatusOr<Action> ParseRequiredAction(absl::string_view text);

// A contiguous run of actions seen as pointers (`for (const Action* leaf : range)`), without
// allocating: what LeafActions returns. Valid while the actions it points into live.
class LeafRange {
 public:
  class Iterator {
   public:
    explicit Iterator(const Action* at) : at_(at) {}
    const Action* operator*() const { return at_; }
    Iterator& operator++() {
      ++at_;
      return *this;
    }
    bool operator!=(const Iterator& other) const { return at_ != other.at_; }

   private:
    const Action* at_;
  };

  LeafRange(const Action* first, size_t size) : first_(first), size_(size) {}
  Iterator begin() const { return Iterator(first_); }
  Iterator end() const { return Iterator(first_ + size_); }
  size_t size() const { return size_; }
  const Action* operator[](size_t i) const { return first_ + i; }

 private:
  const Action* first_;
  size_t size_;
};

// The actions an entry stands for: the sub-actions of an OVERLAP_F_B container, else the
// action itself. Points into `action`, valid while it lives; allocates nothing (it is called for
// every action by the passes, the validator and the simulator).
LeafRange LeafActions(const Action& action);

// True for I and B: the actions that compute (and, across ranks, send) input gradients.
bool IsBackwardInputOrFull(ActionType type);

// True for F, I, W and B: the compute actions that are not containers.
bool IsLeafCompute(ActionType type);

// True for SEND_F, RECV_F, SEND_B and RECV_B.
bool IsSendOrRecv(ActionType type);

// Names a leaf in error messages: "0F3", or "0F3 (in (0F3;3B1)OVERLAP_F_B)" when `leaf` is a
// sub-action of the entry `entry`.
std::string DescribeLeaf(const Action& leaf, const Action& entry);

// One rank's program: actions in order; std::nullopt is an idle time slot (as PyTorch's None).
using RankActions = std::vector<std::optional<Action>>;

// A whole schedule: element r is rank r's program (PyTorch's pipeline_order).
using PipelineOrder = std::vector<RankActions>;

}  // namespace stagecoach::schedule
