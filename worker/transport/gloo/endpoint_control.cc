// Endpoint (endpoint.h): the control messages and their threads, Barrier, Abort, completing and
// failing ops, the watchdog and the send-completion threads.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/util/status_macros.h"
#include "worker/transport/adapter.h"
#include "worker/transport/gloo/endpoint.h"

namespace stagecoach::transport::gloo_internal {

using adapter::Cancelled;
using adapter::Hex;

absl::Status Endpoint::Barrier(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  const uint64_t number = next_barrier_++;
  const std::string what = absl::StrFormat("rank %d: barrier %d", rank_, number);
  if (closing_ || aborted_) return Cancelled(what, closing_);

  int rounds = 0;
  for (int distance = 1; distance < size_; distance *= 2) ++rounds;
  std::vector<std::shared_ptr<Op>> messages;
  for (int round = 0, distance = 1; round < rounds; ++round, distance *= 2) {
    const int to = (rank_ + distance) % size_;
    const int from = (rank_ - distance + size_) % size_;
    ControlMessage message;
    message.kind = static_cast<uint32_t>(ControlKind::kBarrier);
    message.tag = round;
    message.id = number;
    ASSIGN_OR_RETURN(
        std::shared_ptr<Op> sent,
        SendControlLocked(to, message, absl::StrFormat("%s: message to rank %d", what, to)));
    messages.push_back(std::move(sent));
    while (barrier_arrivals_.erase({number, round}) == 0) {
      if (closing_ || aborted_) return Cancelled(what, closing_);
      const absl::Status& peer_error = peers_[from].error;
      if (!peer_error.ok()) {
        return absl::Status(peer_error.code(), absl::StrFormat("%s failed waiting for rank %d: %s",
                                                               what, from, peer_error.message()));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrFormat("%s timed out after %s waiting for rank %d (round %d of %d)", what,
                            absl::FormatDuration(timeout), from, round + 1, rounds));
      }
      changed_.WaitWithDeadline(&mu_, deadline);
    }
  }
  for (const std::shared_ptr<Op>& sent : messages) {
    RETURN_IF_ERROR(WaitLocked(*sent, deadline, timeout));
  }
  return absl::OkStatus();
}

void Endpoint::Abort() {
  absl::MutexLock lock(&mu_);
  if (aborted_ || closing_) return;
  aborted_ = true;
  for (ActiveWait* wait : active_waits_) InterruptLocked(wait, Interrupt::kAbort);
  CloseConnectionsLocked();
  WakeAllLocked();
}

void Endpoint::CloseConnectionsLocked() {
  if (connections_reset_) return;
  connections_reset_ = true;
  try {
    context_->closeConnections();
  } catch (const std::exception&) {
    // Closing is best effort; a connection that fails to close is already broken.
  }
}

void Endpoint::ControlLoop(int peer) {
  absl::MutexLock lock(&mu_);
  Peer& state = peers_[peer];
  while (!closing_ && !aborted_ && state.error.ok()) {
    const size_t index = state.next_control;
    const GlooWaitResult result = WaitGlooLocked(state.control_in_buffers[index].get(),
                                                 /*send=*/false, absl::InfiniteFuture(), nullptr);
    if (!result.error.ok()) {
      SetPeerErrorLocked(peer, result.error);
      break;
    }
    if (!result.completed) continue;  // Interrupted: the loop condition decides.
    state.next_control = (index + 1) % kControlRing;
    const ControlMessage message = state.control_in[index];
    if (!closing_ && !aborted_) {
      absl::Status posted = PostControlRecvLocked(peer, index);
      if (!posted.ok()) SetPeerErrorLocked(peer, posted);
    }
    HandleControlLocked(peer, message);
  }
}

void Endpoint::CompletionLoop(int peer) {
  absl::MutexLock lock(&mu_);
  std::deque<std::shared_ptr<Op>>& sends = peers_[peer].sends_to_complete;
  for (;;) {
    while (!closing_ && !aborted_ && sends.empty()) peers_[peer].completion_wake.Wait(&mu_);
    if (closing_ || aborted_) return;
    std::shared_ptr<Op> op = std::move(sends.front());
    sends.pop_front();
    // No deadline: Abort and Shutdown interrupt it. Its result stays on the op for the Work's
    // own Wait.
    WaitLocked(*op, absl::InfiniteFuture(), absl::InfiniteDuration()).IgnoreError();
  }
}

void Endpoint::HandleControlLocked(int peer, const ControlMessage& message) {
  Peer& state = peers_[peer];
  if (closing_ || aborted_) return;  // Nothing may be posted any more.
  if (message.magic != kControlMagic) {
    SetPeerErrorLocked(
        peer, absl::InternalError(absl::StrFormat("protocol error: control message with magic 0x%x",
                                                  message.magic)));
    return;
  }
  switch (static_cast<ControlKind>(message.kind)) {
    case ControlKind::kRecvPosted:
    case ControlKind::kRecvPostedUpTo: {
      const Announcement announcement{
          message.bytes, message.id,
          static_cast<ControlKind>(message.kind) == ControlKind::kRecvPostedUpTo};
      const std::optional<std::shared_ptr<Op>> op = TakeOldest(state.unmatched_sends, message.tag);
      if (!op.has_value()) {
        state.announced_recvs[message.tag].push_back(announcement);
        return;
      }
      if ((*op)->state == OpState::kUnmatched) MatchLocked(*op, announcement).IgnoreError();
      return;
    }
    case ControlKind::kReject: {
      auto posted = state.recvs.find(message.id);
      if (posted == state.recvs.end()) return;
      Op& op = *posted->second;
      state.recvs.erase(posted);
      if (op.state != OpState::kPosted) return;
      // Its gloo receive stays posted (gloo cannot take it back), but nothing is sent to it.
      FailLocked(
          op, absl::StatusCode::kInternal,
          absl::StrFormat("expected %s%d bytes from rank %d tag %s, got %d",
                          op.up_to ? "at most " : "", op.bytes, peer, Hex(op.tag), message.bytes));
      for (ActiveWait* wait : active_waits_) {
        if (wait->op == &op) InterruptLocked(wait, Interrupt::kReject);
      }
      return;
    }
    case ControlKind::kBarrier:
      barrier_arrivals_.insert({message.id, message.tag});
      changed_.SignalAll();
      return;
  }
  SetPeerErrorLocked(peer, absl::InternalError(absl::StrFormat(
                               "protocol error: control message of kind %d", message.kind)));
}

void Endpoint::CompleteLocked(Op& op) {
  op.state = OpState::kDone;
  op.buffer.reset();
  op.changed.SignalAll();
  if (!op.internal) {
    if (op.direction == Direction::kSend) {
      counters_.CountSent(op.bytes);
    } else {
      counters_.CountReceived(op.bytes);
      peers_[op.peer].recvs.erase(op.id);
    }
  }
  outstanding_.erase(&op);  // Last: it may hold the last reference to op.
}

void Endpoint::FailLocked(Op& op, absl::StatusCode code, absl::string_view message) {
  op.state = OpState::kFailed;
  op.error = absl::Status(code, absl::StrFormat("%s failed: %s", op.label, message));
  op.changed.SignalAll();
}

absl::Status Endpoint::TimeoutError(const Op& op, absl::Duration timeout) const {
  const char* hint = "";
  if (op.direction == Direction::kRecv) {
    hint = "nothing has arrived from the sender yet";
  } else {
    hint = op.state == OpState::kUnmatched ? "the receiver has not posted it yet"
                                           : "the receiver has not taken it yet";
  }
  return adapter::TimedOut(op.label, timeout, hint);
}

void Endpoint::SetPeerErrorLocked(int peer, const absl::Status& status) {
  Peer& state = peers_[peer];
  if (!state.error.ok()) return;
  state.error = absl::Status(
      status.code(), absl::StrFormat("connection to rank %d failed: %s", peer, status.message()));
  WakeAllLocked(peer);
}

void Endpoint::WakeAllLocked(int peer) {
  for (auto& [unused, op] : outstanding_) {
    if (peer < 0 || op->peer == peer) op->changed.SignalAll();
  }
  changed_.SignalAll();
  for (Peer& state : peers_) state.completion_wake.Signal();
}

void Endpoint::WatchdogLoop() {
  absl::MutexLock lock(&mu_);
  while (!closing_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    for (ActiveWait* wait : active_waits_) {
      if (wait->interrupt != Interrupt::kNone) continue;
      if (wait->deadline <= now) {
        InterruptLocked(wait, Interrupt::kDeadline);
      } else {
        next = std::min(next, wait->deadline);
      }
    }
    watchdog_until_ = next;
    watchdog_wake_.WaitWithDeadline(&mu_, next);
  }
}

}  // namespace stagecoach::transport::gloo_internal
