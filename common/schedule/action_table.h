// Internal to the schedule library: dense per-(type, stage, microbatch) storage, so that passes
// and checks over schedules with millions of actions run in linear time without hashing.
#pragma once

#include <vector>

#include "common/schedule/action.h"

namespace stagecoach::schedule::internal {

// One T for every (type, stage, microbatch) with a microbatch-carrying type (F, I, W, B, SEND_F,
// RECV_F, SEND_B, RECV_B), stage in [0, num_stages) and microbatch in [0, num_microbatches).
// Callers check the ranges (InRange) before indexing.
template <typename T>
class ActionTable {
 public:
  ActionTable(int num_stages, int num_microbatches, T init = T{})
      : num_stages_(num_stages),
        num_microbatches_(num_microbatches),
        cells_(static_cast<size_t>(kSlots) * num_stages * num_microbatches, init) {}

  bool InRange(int stage, int microbatch) const {
    return stage >= 0 && stage < num_stages_ && microbatch >= 0 && microbatch < num_microbatches_;
  }

  T& operator()(ActionType type, int stage, int microbatch) {
    return cells_[Index(type, stage, microbatch)];
  }
  const T& operator()(ActionType type, int stage, int microbatch) const {
    return cells_[Index(type, stage, microbatch)];
  }
  // The cell of a leaf action that carries a microbatch.
  T& operator[](const Action& leaf) { return (*this)(leaf.type, leaf.stage, *leaf.microbatch); }
  const T& operator[](const Action& leaf) const {
    return (*this)(leaf.type, leaf.stage, *leaf.microbatch);
  }

 private:
  static constexpr int kSlots = 8;

  static int Slot(ActionType type) {
    switch (type) {
      case ActionType::kForward:
        return 0;
      case ActionType::kBackwardInput:
        return 1;
      case ActionType::kBackwardWeight:
        return 2;
      case ActionType::kFullBackward:
        return 3;
      case ActionType::kSendF:
        return 4;
      case ActionType::kRecvF:
        return 5;
      case ActionType::kSendB:
        return 6;
      case ActionType::kRecvB:
        return 7;
      default:
        return -1;  // not stored; HasMicrobatch(type) is false
    }
  }

  size_t Index(ActionType type, int stage, int microbatch) const {
    return (static_cast<size_t>(Slot(type)) * num_stages_ + stage) * num_microbatches_ + microbatch;
  }

  int num_stages_;
  int num_microbatches_;
  std::vector<T> cells_;
};

}  // namespace stagecoach::schedule::internal
