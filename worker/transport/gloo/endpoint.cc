// Endpoint (endpoint.h): starting and stopping, posting transfers, and waiting for them.
#include "worker/transport/gloo/endpoint.h"

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

namespace stagecoach::transport::gloo_internal {

using adapter::Cancelled;
using adapter::Hex;

namespace {

// Where a payload's gloo buffer points: a zero-byte transfer may pass null, gloo wants an address.
void* PayloadData(const Op& op) {
  static char zero_bytes;
  return op.data != nullptr ? op.data : &zero_bytes;
}

}  // namespace

void Endpoint::Start() {
  absl::MutexLock lock(&mu_);
  threads_.emplace_back([this] { WatchdogLoop(); });
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Peer& state = peers_[peer];
    absl::Status posted;
    for (size_t i = 0; i < kControlRing && posted.ok(); ++i) {
      state.control_in_buffers[i] =
          context_->createUnboundBuffer(&state.control_in[i], sizeof(ControlMessage));
      posted = PostControlRecvLocked(peer, i);
    }
    if (!posted.ok()) {
      SetPeerErrorLocked(peer, posted);
      continue;
    }
    threads_.emplace_back([this, peer] { ControlLoop(peer); });
    threads_.emplace_back([this, peer] { CompletionLoop(peer); });
  }
}

void Endpoint::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    // Works not completed reset the connections. Control messages do not: a receive's
    // announcement the completion thread has not reaped yet was written long ago, and a reset
    // could drop the last barrier messages a peer has still to read.
    const bool works_pending =
        std::any_of(outstanding_.begin(), outstanding_.end(),
                    [](const auto& entry) { return !entry.second->internal; });
    if (works_pending) CloseConnectionsLocked();
    for (ActiveWait* wait : active_waits_) InterruptLocked(wait, Interrupt::kClose);
    watchdog_wake_.Signal();
    WakeAllLocked();
  }
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();

  std::shared_ptr<::gloo::rendezvous::Context> context;
  {
    absl::MutexLock lock(&mu_);
    // A caller that destroys the transport while another of its threads is still in Wait
    // was interrupted above; let it leave gloo before the buffers go.
    while (!active_waits_.empty()) changed_.Wait(&mu_);
    closed_ = true;
    // Destroying a connection unregisters it from gloo's event loop (waiting for the loop to
    // tick) and closes its socket: gracefully unless reset above. Only then is it safe to
    // destroy buffers still posted on it (control receives, abandoned transfers).
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      try {
        context_->getPair(peer).reset();
      } catch (const std::exception&) {
        // No connection to release.
      }
    }
    for (auto& [unused, op] : outstanding_) op->buffer.reset();
    outstanding_.clear();
    for (Peer& peer : peers_) {
      for (std::unique_ptr<GlooBuffer>& buffer : peer.control_in_buffers) buffer.reset();
      peer.unmatched_sends.clear();
      peer.recvs.clear();
      peer.sends_to_complete.clear();
    }
    context = std::move(context_);
  }
  context.reset();
}

absl::Status Endpoint::CheckPeer(int peer, const char* verb) const {
  if (peer < 0 || peer >= size_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d: %s rank %d: no such rank (world size %d)", rank_, verb, peer, size_));
  }
  if (peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d: %s rank %d: that is this rank", rank_, verb, peer));
  }
  return absl::OkStatus();
}

absl::Status Endpoint::CheckUsableLocked(int peer, const std::string& label) const {
  if (closing_ || aborted_) return Cancelled(label, closing_);
  const absl::Status& error = peers_[peer].error;
  if (!error.ok()) {
    return absl::Status(error.code(), absl::StrFormat("%s failed: %s", label, error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Endpoint::CheckTransfer(Direction direction, const void* data,
                                                    size_t bytes, int peer, uint64_t tag) const {
  const char* verb = direction == Direction::kSend ? "send to" : "receive from";
  RETURN_IF_ERROR(CheckPeer(peer, verb));
  std::string label = adapter::TransferLabel(rank_, verb, peer, tag, bytes);
  if (data == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(label + ": data is null");
  }
  return label;
}

absl::StatusOr<std::shared_ptr<Op>> Endpoint::Send(const void* data, size_t bytes, int peer,
                                                   uint64_t tag) {
  ASSIGN_OR_RETURN(std::string label, CheckTransfer(Direction::kSend, data, bytes, peer, tag));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckUsableLocked(peer, label));
  auto op = std::make_shared<Op>(Direction::kSend, peer, tag, bytes, const_cast<void*>(data),
                                 /*internal=*/false, std::move(label));
  outstanding_[op.get()] = op;
  Peer& state = peers_[peer];
  const std::optional<Announcement> announcement = TakeOldest(state.announced_recvs, tag);
  if (!announcement.has_value()) {
    state.unmatched_sends[tag].push_back(op);  // The control thread matches it.
    return op;
  }
  RETURN_IF_ERROR(MatchLocked(op, *announcement));
  return op;
}

absl::StatusOr<std::shared_ptr<Op>> Endpoint::Recv(void* data, size_t bytes, int peer,
                                                   uint64_t tag) {
  return PostRecv(data, bytes, peer, tag, /*up_to=*/false);
}

absl::StatusOr<std::shared_ptr<Op>> Endpoint::RecvUpTo(void* data, size_t max_bytes, int peer,
                                                       uint64_t tag) {
  return PostRecv(data, max_bytes, peer, tag, /*up_to=*/true);
}

absl::StatusOr<std::shared_ptr<Op>> Endpoint::PostRecv(void* data, size_t bytes, int peer,
                                                       uint64_t tag, bool up_to) {
  ASSIGN_OR_RETURN(std::string label, CheckTransfer(Direction::kRecv, data, bytes, peer, tag));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckUsableLocked(peer, label));
  auto op = std::make_shared<Op>(Direction::kRecv, peer, tag, bytes, data, /*internal=*/false,
                                 std::move(label));
  Peer& state = peers_[peer];
  op->id = state.next_recv_id++;
  op->state = OpState::kPosted;
  op->up_to = up_to;
  outstanding_[op.get()] = op;
  // The receive first: gloo's notice of it then reaches the sender before the announcement.
  const absl::Status posted = GlooCall([&] {
    op->buffer = context_->createUnboundBuffer(PayloadData(*op), bytes);
    op->buffer->recv(peer, kPayloadSlotBase + op->id, 0, bytes);
  });
  if (!posted.ok()) return FailLocked(*op, posted);
  state.recvs[op->id] = op.get();
  ControlMessage announcement;
  announcement.kind =
      static_cast<uint32_t>(up_to ? ControlKind::kRecvPostedUpTo : ControlKind::kRecvPosted);
  announcement.tag = tag;
  announcement.bytes = bytes;
  announcement.id = op->id;
  const absl::StatusOr<std::shared_ptr<Op>> announced = SendControlLocked(
      peer, announcement, absl::StrFormat("rank %d: announcing %s", rank_, op->label));
  if (!announced.ok()) return FailLocked(*op, announced.status());
  return op;
}

absl::Status Endpoint::MatchLocked(const std::shared_ptr<Op>& op,
                                   const Announcement& announcement) {
  const bool fits =
      announcement.up_to ? op->bytes <= announcement.bytes : op->bytes == announcement.bytes;
  if (!fits) {
    FailLocked(*op, absl::StatusCode::kInternal,
               absl::StrFormat("rank %d expected %s%d bytes for tag %s, this send has %d", op->peer,
                               announcement.up_to ? "at most " : "", announcement.bytes,
                               Hex(op->tag), op->bytes));
    // Fail the receive too: nothing will be sent to it. Best effort.
    ControlMessage reject;
    reject.kind = static_cast<uint32_t>(ControlKind::kReject);
    reject.tag = op->tag;
    reject.bytes = op->bytes;
    reject.id = announcement.id;
    SendControlLocked(op->peer, reject,
                      absl::StrFormat("rank %d: size mismatch notice to rank %d", rank_, op->peer))
        .IgnoreError();
    return absl::OkStatus();
  }
  op->id = announcement.id;
  return PostSendLocked(op, kPayloadSlotBase + announcement.id);
}

absl::Status Endpoint::PostSendLocked(const std::shared_ptr<Op>& op, uint64_t slot) {
  void* data = op->internal ? static_cast<void*>(&op->control) : PayloadData(*op);
  const absl::Status posted = GlooCall([&] {
    op->buffer = context_->createUnboundBuffer(data, op->bytes);
    op->buffer->send(op->peer, slot, 0, op->bytes);
  });
  if (!posted.ok()) return FailLocked(*op, posted);
  op->state = OpState::kPosted;
  op->changed.SignalAll();
  Peer& state = peers_[op->peer];
  state.sends_to_complete.push_back(op);
  state.completion_wake.Signal();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Op>> Endpoint::SendControlLocked(int peer,
                                                                const ControlMessage& message,
                                                                const std::string& label) {
  RETURN_IF_ERROR(CheckUsableLocked(peer, label));
  auto op = std::make_shared<Op>(Direction::kSend, peer, message.tag, sizeof(ControlMessage),
                                 nullptr, /*internal=*/true, label);
  op->control = message;
  outstanding_[op.get()] = op;
  RETURN_IF_ERROR(PostSendLocked(op, kControlSlot));
  return op;
}

absl::Status Endpoint::PostControlRecvLocked(int peer, size_t index) {
  return GlooCall([&] {
    peers_[peer].control_in_buffers[index]->recv(peer, kControlSlot, 0, sizeof(ControlMessage));
  });
}

bool Endpoint::Done(const Op& op) const {
  absl::MutexLock lock(&mu_);
  return op.state == OpState::kDone || op.state == OpState::kFailed || closing_ || aborted_;
}

absl::Status Endpoint::Wait(Op& op, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  return WaitLocked(op, deadline, timeout);
}

absl::Status Endpoint::WaitLocked(Op& op, absl::Time deadline, absl::Duration timeout) {
  for (;;) {
    if (op.state == OpState::kDone) return absl::OkStatus();
    if (op.state == OpState::kFailed) return op.error;
    if (closing_ || aborted_) return Cancelled(op.label, closing_);

    if (op.state == OpState::kUnmatched) {
      const absl::Status& peer_error = peers_[op.peer].error;
      if (!peer_error.ok()) {
        FailLocked(op, peer_error.code(), peer_error.message());
        continue;
      }
    }
    if (op.state == OpState::kUnmatched || op.waited_on) {
      // Not posted yet, or another thread waits on its gloo buffer: wait for that to change.
      if (absl::Now() >= deadline) return TimeoutError(op, timeout);
      op.changed.WaitWithDeadline(&mu_, deadline);
      continue;
    }

    // kPosted.
    op.waited_on = true;
    const GlooWaitResult result =
        WaitGlooLocked(op.buffer.get(), op.direction == Direction::kSend,
                       std::max(deadline, absl::Now() + kMinGlooWait), &op);
    op.waited_on = false;
    op.changed.SignalAll();
    if (!result.error.ok()) {
      if (op.state != OpState::kFailed) {
        FailLocked(op, result.error.code(), result.error.message());
      }
      continue;
    }
    if (result.completed) {
      if (op.state == OpState::kPosted) CompleteLocked(op);
      continue;
    }
    if (op.state == OpState::kFailed || aborted_ || closing_) continue;
    if (result.interrupt == Interrupt::kDeadline) return TimeoutError(op, timeout);
  }
}

GlooWaitResult Endpoint::WaitGlooLocked(GlooBuffer* buffer, bool send, absl::Time deadline,
                                        const Op* op) {
  ActiveWait wait{buffer, send, deadline, op};
  active_waits_.insert(&wait);
  if (closing_) {
    InterruptLocked(&wait, Interrupt::kClose);
  } else if (aborted_) {
    InterruptLocked(&wait, Interrupt::kAbort);
  } else if (deadline < watchdog_until_) {
    watchdog_wake_.Signal();  // The watchdog would sleep past this deadline.
  }
  GlooWaitResult result;
  mu_.Unlock();
  result.error = GlooCall([&] {
    result.completed =
        send ? buffer->waitSend(nullptr, kGlooForever) : buffer->waitRecv(nullptr, kGlooForever);
  });
  mu_.Lock();
  active_waits_.erase(&wait);
  result.interrupt = wait.interrupt;
  if (closing_) changed_.SignalAll();  // Shutdown waits for every wait to leave gloo.
  return result;
}

void Endpoint::InterruptLocked(ActiveWait* wait, Interrupt why) {
  if (wait->interrupt != Interrupt::kNone) return;
  wait->interrupt = why;
  if (wait->send) {
    wait->buffer->abortWaitSend();
  } else {
    wait->buffer->abortWaitRecv();
  }
}

}  // namespace stagecoach::transport::gloo_internal
