// Endpoint (endpoint.h): starting and stopping, posting transfers, and waiting for them.
#include "worker/transport/gloo/endpoint.h"

#include <algorithm>
#include <memory>
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

void Endpoint::Start() {
  absl::MutexLock lock(&mu_);
  threads_.emplace_back([this] { WatchdogLoop(); });
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    peers_[peer].control_in_buffer =
        context_->createUnboundBuffer(&peers_[peer].control_in, sizeof(ControlMessage));
    absl::Status posted = PostControlRecvLocked(peer);
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
    if (!outstanding_.empty()) CloseConnectionsLocked();
    for (ActiveWait* wait : active_waits_) InterruptLocked(wait, Interrupt::kClose);
    watchdog_wake_.Signal();
    changed_.SignalAll();
    for (Peer& peer : peers_) peer.completion_wake.Signal();
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
    for (auto& [unused, op] : outstanding_) {
      op->payload.reset();
      op->control_buffer.reset();
    }
    outstanding_.clear();
    for (Peer& peer : peers_) {
      peer.control_in_buffer.reset();
      peer.unmatched_recvs.clear();
      peer.sends.clear();
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
  Peer& state = peers_[peer];
  op->id = state.next_send_id++;
  op->control.kind = static_cast<uint32_t>(ControlKind::kData);
  op->control.tag = tag;
  op->control.bytes = bytes;
  op->control.id = op->id;
  outstanding_[op.get()] = op;
  op->state = OpState::kPosted;
  const absl::Status posted = GlooCall([&] {
    // The payload first: its receive is posted only after the announcement has arrived, so
    // gloo's event loop writes it, never this thread.
    if (bytes > 0) {
      op->payload = context_->createUnboundBuffer(op->data, bytes);
      op->payload->send(peer, kPayloadSlotBase + op->id, 0, bytes);
    }
    op->control_buffer = context_->createUnboundBuffer(&op->control, sizeof(ControlMessage));
    op->control_buffer->send(peer, kControlSlot, 0, sizeof(ControlMessage));
  });
  if (!posted.ok()) return FailLocked(*op, posted);
  state.sends[op->id] = op.get();
  state.sends_to_complete.push_back(op);
  state.completion_wake.Signal();
  return op;
}

absl::StatusOr<std::shared_ptr<Op>> Endpoint::Recv(void* data, size_t bytes, int peer,
                                                   uint64_t tag) {
  ASSIGN_OR_RETURN(std::string label, CheckTransfer(Direction::kRecv, data, bytes, peer, tag));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckUsableLocked(peer, label));
  auto op = std::make_shared<Op>(Direction::kRecv, peer, tag, bytes, data, /*internal=*/false,
                                 std::move(label));
  outstanding_[op.get()] = op;
  Peer& state = peers_[peer];
  auto announced = state.unmatched_sends.find(tag);
  if (announced == state.unmatched_sends.end()) {
    state.unmatched_recvs[tag].push_back(op);
    return op;
  }
  const Announcement announcement = announced->second.front();
  announced->second.pop_front();
  if (announced->second.empty()) state.unmatched_sends.erase(announced);
  RETURN_IF_ERROR(MatchLocked(*op, announcement));
  return op;
}

absl::Status Endpoint::MatchLocked(Op& op, const Announcement& announcement) {
  if (announcement.bytes != op.bytes) {
    FailLocked(op, absl::StatusCode::kInternal,
               absl::StrFormat("expected %d bytes from rank %d tag %s, got %d", op.bytes, op.peer,
                               Hex(op.tag), announcement.bytes));
    // Fail the send too: nobody will receive its payload. Best effort.
    ControlMessage reject;
    reject.kind = static_cast<uint32_t>(ControlKind::kReject);
    reject.tag = op.tag;
    reject.bytes = op.bytes;
    reject.id = announcement.id;
    SendControlLocked(op.peer, reject,
                      absl::StrFormat("rank %d: size mismatch notice to rank %d", rank_, op.peer))
        .IgnoreError();
    return absl::OkStatus();
  }
  op.state = OpState::kPosted;
  if (op.bytes == 0) return absl::OkStatus();
  const absl::Status posted = GlooCall([&] {
    op.payload = context_->createUnboundBuffer(op.data, op.bytes);
    op.payload->recv(op.peer, kPayloadSlotBase + announcement.id, 0, op.bytes);
  });
  return posted.ok() ? posted : FailLocked(op, posted);
}

absl::StatusOr<std::shared_ptr<Op>> Endpoint::SendControlLocked(int peer,
                                                                const ControlMessage& message,
                                                                const std::string& label) {
  RETURN_IF_ERROR(CheckUsableLocked(peer, label));
  auto op = std::make_shared<Op>(Direction::kSend, peer, message.tag, 0, nullptr,
                                 /*internal=*/true, label);
  op->control = message;
  op->state = OpState::kPosted;
  outstanding_[op.get()] = op;
  const absl::Status posted = GlooCall([&] {
    op->control_buffer = context_->createUnboundBuffer(&op->control, sizeof(ControlMessage));
    op->control_buffer->send(peer, kControlSlot, 0, sizeof(ControlMessage));
  });
  if (!posted.ok()) return FailLocked(*op, posted);
  return op;
}

absl::Status Endpoint::PostControlRecvLocked(int peer) {
  return GlooCall(
      [&] { peers_[peer].control_in_buffer->recv(peer, kControlSlot, 0, sizeof(ControlMessage)); });
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
      if (absl::Now() >= deadline) return TimeoutError(op, timeout);
      changed_.WaitWithDeadline(&mu_, deadline);
      continue;
    }

    // kPosted: wait for the next unfinished gloo transfer of this op.
    GlooBuffer* buffer = nullptr;
    bool send = op.direction == Direction::kSend;
    const bool control_stage = op.control_buffer != nullptr && !op.control_sent;
    if (control_stage) {
      buffer = op.control_buffer.get();
      send = true;
    } else if (op.payload != nullptr && !op.payload_done) {
      buffer = op.payload.get();
    } else {
      CompleteLocked(op);
      continue;
    }
    if (op.waited_on) {  // Another thread waits on its gloo buffer: wait for it to come back.
      if (absl::Now() >= deadline) return TimeoutError(op, timeout);
      changed_.WaitWithDeadline(&mu_, deadline);
      continue;
    }
    op.waited_on = true;
    const GlooWaitResult result =
        WaitGlooLocked(buffer, send, std::max(deadline, absl::Now() + kMinGlooWait), &op);
    op.waited_on = false;
    if (!result.error.ok()) {
      if (op.state != OpState::kFailed) {
        FailLocked(op, result.error.code(), result.error.message());
      }
      continue;
    }
    if (result.completed) {
      (control_stage ? op.control_sent : op.payload_done) = true;
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
  } else if (deadline != absl::InfiniteFuture()) {
    watchdog_wake_.Signal();
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
  changed_.SignalAll();
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
