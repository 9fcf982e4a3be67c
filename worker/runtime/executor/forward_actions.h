// The forward part of a rank's training action list, for a forward-only step on a training
// job's weights (ClientStep.forward_only): the F, SEND_F and RECV_F actions, in their order.
// No LibTorch.
#pragma once

#include <vector>

#include "common/schedule/action.h"

namespace stagecoach::runtime {

// The F, SEND_F and RECV_F actions of `actions`, in order; an OVERLAP_F_B container contributes
// its forward sub-action(s) where it stands. Everything else (B, I, W, SEND_B, RECV_B,
// REDUCE_GRAD, UNSHARD, RESHARD) is left out.
std::vector<schedule::Action> ForwardActions(const std::vector<schedule::Action>& actions);

}  // namespace stagecoach::runtime
