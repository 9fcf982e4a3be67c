// See forward_actions.h.
#include "worker/runtime/executor/forward_actions.h"

namespace stagecoach::runtime {

std::vector<schedule::Action> ForwardActions(const std::vector<schedule::Action>& actions) {
  using schedule::ActionType;
  std::vector<schedule::Action> out;
  for (const schedule::Action& entry : actions) {
    for (const schedule::Action* leaf : schedule::LeafActions(entry)) {
      if (leaf->type == ActionType::kForward || leaf->type == ActionType::kSendF ||
          leaf->type == ActionType::kRecvF) {
        out.push_back(*leaf);
      }
    }
  }
  return out;
}

}  // namespace stagecoach::runtime
