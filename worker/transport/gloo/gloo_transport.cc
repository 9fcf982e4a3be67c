// The Gloo backend of Transport (factory.h): point-to-point transfers with gloo's TCP transport,
// unbound buffers on a gloo context of its own with one connection per pair of ranks.
//
// What this Gloo (Debian libgloo 0.0~git20220518) does, found by experiment, and what it means
// for the design:
//  - Byte counts: gloo pairs a send with a receive by (peer, slot) alone. A send larger than
//    its receive trips a GLOO_ENFORCE on gloo's event-loop thread, where nothing catches it:
//    std::terminate, the process aborts. A smaller send completes the receive as if it were
//    whole: silent truncation. Hence the protocol below.
//  - Timeouts: when waitSend/waitRecv times out, gloo closes every connection of the context
//    ("Application timeout caused pair closure"): one late transfer would kill the transport.
//    So no gloo wait here has a timeout; deadlines are enforced by interrupting waits.
//  - Peer death: a send or receive posted on the connection to a peer that died fails within a
//    millisecond with gloo::IoException "Connection closed by peer"; posting on a failed
//    connection throws at once. A receive from any rank is not woken, so this file never uses
//    one.
//  - Interrupts: abortWaitSend/abortWaitRecv wake the buffer's waiter. The flag stays set until
//    a wait consumes it, and then wins even over a completed transfer (the next wait returns
//    the completion). closeConnections() resets every connection (peers read "Connection reset
//    by peer") but wakes no local waiter.
//  - Slots: the TCP transport accepts the whole uint64 range and reserves no bits; only gloo's
//    collectives carve prefixes out of it (gloo/types.h), and none run on this context.
//  - Addresses: tcp::CreateDevice segfaults on a host name that does not resolve (it checks
//    getaddrinfo's result against -1 only), so it is only ever given numeric addresses.
//
// Protocol. Each rank keeps one receive posted on kControlSlot per peer, served by a thread per
// peer. Send(data, n, peer, tag) posts the payload on a slot of its own, kPayloadSlotBase + id
// (id counts the sends to that peer), then a 32-byte ControlMessage {kData, tag, n, id} on
// kControlSlot. The receiver's control thread matches it with the oldest unmatched Recv from
// that peer with that tag (or queues it until such a Recv is posted) and, only if both byte
// counts agree, posts the payload receive on the announced slot: gloo never sees a receive of
// another size than its send. On a mismatch the receive fails ("expected N bytes from rank p
// tag t, got M") and a {kReject} message fails the send, whose payload nobody will take. The
// payload is posted before its announcement, so it is always written by gloo's event loop,
// never inline in Send. User tags travel in control messages and never become slots, so every
// uint64 tag is valid. Barrier is a dissemination barrier of {kBarrier} control messages.
// A send's Work completes when its announcement and payload are written to the socket; a
// receive's when the payload has arrived. Stats count a transfer when a Wait sees it complete.
//
// Waiting: a wait on a gloo buffer blocks without a timeout and is registered in
// active_waits_; a watchdog thread interrupts those past their deadline, Abort all of them,
// a reject the send it fails. A timed-out transfer stays posted: waiting again may complete it.
//
// Teardown: Abort resets every connection (closeConnections; gloo unregisters each socket from
// its event loop and waits for the loop to tick, so once Abort returns gloo touches no user
// buffer). The destructor interrupts every wait and stops the threads. After Abort, or with
// Works not completed, it resets the connections the same way; otherwise (every Work
// completed, as after a Barrier) it closes them gracefully, so that the last control messages
// written still reach peers that have not read them yet. It destroys each connection before
// the gloo buffers still posted on it. Works may outlive their transport; Wait then returns
// CANCELLED.
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/util/status_macros.h"
#include "worker/transport/adapter.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/gloo/store_adapter.h"

namespace stagecoach::transport {
namespace {

using GlooBuffer = ::gloo::transport::UnboundBuffer;
using adapter::Cancelled;
using adapter::Hex;

constexpr uint64_t kControlSlot = 1;
constexpr uint64_t kPayloadSlotBase = uint64_t{1} << 63;
constexpr uint32_t kControlMagic = 0x31474353;  // "SCG1"

// What a gloo wait is given instead of a timeout (gloo's timeout would close the context).
constexpr std::chrono::milliseconds kGlooForever = std::chrono::hours(24 * 365);
// The least time a wait on a gloo buffer gets, so that Wait(0) still sees a finished transfer.
constexpr absl::Duration kMinGlooWait = absl::Milliseconds(1);

enum class ControlKind : uint32_t { kData = 1, kReject = 2, kBarrier = 3 };

// Wire format, host byte order: every rank of a job runs the same build.
struct ControlMessage {
  uint32_t magic = kControlMagic;
  uint32_t kind = 0;
  uint64_t tag = 0;    // kData, kReject: the user's tag. kBarrier: the round.
  uint64_t bytes = 0;  // kData: payload bytes. kReject: the bytes the receiver expected.
  uint64_t id = 0;     // kData, kReject: the send's id. kBarrier: the barrier's number.
};
static_assert(sizeof(ControlMessage) == 32, "ControlMessage is a wire format");

// Runs gloo calls: a gloo::IoException (a connection failed) becomes UNAVAILABLE, anything else
// they throw INTERNAL, with gloo's message.
template <typename Fn>
absl::Status GlooCall(Fn&& fn) {
  try {
    fn();
  } catch (const ::gloo::IoException& e) {
    return absl::UnavailableError(e.what());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
  return absl::OkStatus();
}

enum class Direction { kSend, kRecv };

// kUnmatched: a receive whose send has not been announced yet. kPosted: posted to gloo.
enum class OpState { kUnmatched, kPosted, kDone, kFailed };

// One Send, Recv, or internal control message. The fields after the constant ones are
// guarded by Endpoint::mu_.
struct Op {
  Op(Direction direction, int peer, uint64_t tag, size_t bytes, void* data, bool internal,
     std::string label)
      : direction(direction),
        peer(peer),
        tag(tag),
        bytes(bytes),
        data(data),
        internal(internal),
        label(std::move(label)) {}

  const Direction direction;
  const int peer;
  const uint64_t tag;
  const size_t bytes;
  void* const data;
  const bool internal;      // A barrier or reject message: not counted in stats.
  const std::string label;  // "rank 1: receive from rank 0 (tag 0x7, 64 bytes)"

  OpState state = OpState::kUnmatched;
  absl::Status error;      // kFailed.
  uint64_t id = 0;         // User sends: the payload's slot is kPayloadSlotBase + id.
  ControlMessage control;  // Sends: what control_buffer sends.
  std::unique_ptr<GlooBuffer> control_buffer;  // Sends; released when done.
  std::unique_ptr<GlooBuffer> payload;         // Null for 0 bytes; released when done.
  bool control_sent = false;
  bool payload_done = false;
};

// Why a wait on a gloo buffer was interrupted.
enum class Interrupt { kNone, kDeadline, kAbort, kClose, kReject };

// A thread blocked on a gloo buffer, registered so that other threads can interrupt it.
struct ActiveWait {
  GlooBuffer* buffer;
  bool send;
  absl::Time deadline;
  const Op* op;  // Null for control receives.
  Interrupt interrupt = Interrupt::kNone;
};

struct GlooWaitResult {
  bool completed = false;
  Interrupt interrupt = Interrupt::kNone;
  absl::Status error;  // gloo threw: UNAVAILABLE for I/O errors, else INTERNAL.
};

// The state shared by a transport, its threads and its Works (which may outlive it).
class Endpoint {
 public:
  Endpoint(int rank, int size, std::shared_ptr<::gloo::rendezvous::Context> context)
      : rank_(rank), size_(size), context_(std::move(context)), peers_(size) {}

  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Posts the control receives and starts the threads. Called once, before anything else.
  void Start();
  // Interrupts every wait, stops the threads, closes the connections and releases gloo.
  // Called once, by the transport's destructor.
  void Shutdown();

  absl::StatusOr<std::shared_ptr<Op>> Send(const void* data, size_t bytes, int peer, uint64_t tag);
  absl::StatusOr<std::shared_ptr<Op>> Recv(void* data, size_t bytes, int peer, uint64_t tag);
  absl::Status Wait(Op& op, absl::Duration timeout);
  absl::Status Barrier(absl::Duration timeout);
  void Abort();

  TransferStats stats() const { return counters_.stats(); }

 private:
  struct Announcement {
    uint64_t bytes;
    uint64_t id;
  };

  struct Peer {
    absl::Status error;  // OK while the connection works.
    uint64_t next_send_id = 0;
    ControlMessage control_in;
    std::unique_ptr<GlooBuffer> control_in_buffer;
    // Receives posted before their send was announced, and announcements that arrived
    // before their receive was posted, by tag, oldest first.
    std::map<uint64_t, std::deque<std::shared_ptr<Op>>> unmatched_recvs;
    std::map<uint64_t, std::deque<Announcement>> unmatched_sends;
    std::map<uint64_t, Op*> sends;  // User sends by id, until done (so a reject finds them).
  };

  absl::Status CheckPeer(int peer, const char* verb) const;
  absl::Status CheckUsableLocked(int peer, const std::string& label) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a user Send or Recv's arguments and returns its label.
  absl::StatusOr<std::string> CheckTransfer(Direction direction, const void* data, size_t bytes,
                                            int peer, uint64_t tag) const;

  absl::Status WaitLocked(Op& op, absl::Time deadline, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks on `buffer`'s pending send or receive; releases mu_ meanwhile.
  GlooWaitResult WaitGlooLocked(GlooBuffer* buffer, bool send, absl::Time deadline, const Op* op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void InterruptLocked(ActiveWait* wait, Interrupt why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Posts a receive announced as `announcement`, or fails it on a size mismatch. Returns an
  // error only when gloo refused the receive (the op is failed as well).
  absl::Status MatchLocked(Op& op, const Announcement& announcement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts an internal control message to `peer`.
  absl::StatusOr<std::shared_ptr<Op>> SendControlLocked(int peer, const ControlMessage& message,
                                                        const std::string& label)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PostControlRecvLocked(int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleControlLocked(int peer, const ControlMessage& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void CompleteLocked(Op& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(Op& op, absl::StatusCode code, absl::string_view message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails `op` with `cause`'s code and message; returns op.error.
  const absl::Status& FailLocked(Op& op, const absl::Status& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FailLocked(op, cause.code(), cause.message());
    return op.error;
  }
  absl::Status TimeoutError(const Op& op, absl::Duration timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetPeerErrorLocked(int peer, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseConnectionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ControlLoop(int peer);
  void WatchdogLoop();

  const int rank_;
  const int size_;

  mutable absl::Mutex mu_;
  // Signalled on every change a waiter may wait for: a match, a barrier message, a peer
  // error, Abort, Shutdown, a wait leaving gloo.
  absl::CondVar changed_;
  absl::CondVar watchdog_wake_;  // A new deadline, or Shutdown.

  std::shared_ptr<::gloo::rendezvous::Context> context_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown began.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;   // gloo released.
  bool connections_reset_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mu_);  // Indexed by rank; never resized.
  // Ops not done yet, kept alive for gloo (which holds their buffers) even when their Work is
  // gone, until Shutdown.
  std::map<const Op*, std::shared_ptr<Op>> outstanding_ ABSL_GUARDED_BY(mu_);
  std::set<ActiveWait*> active_waits_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, uint64_t>> barrier_arrivals_ ABSL_GUARDED_BY(mu_);  // (n, round)
  uint64_t next_barrier_ ABSL_GUARDED_BY(mu_) = 0;

  adapter::TransferCounters counters_;

  std::vector<std::thread> threads_;  // Only Start and Shutdown touch it.
};

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
    const GlooWaitResult result =
        WaitGlooLocked(buffer, send, std::max(deadline, absl::Now() + kMinGlooWait), &op);
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
  changed_.SignalAll();
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
    const GlooWaitResult result = WaitGlooLocked(state.control_in_buffer.get(), /*send=*/false,
                                                 absl::InfiniteFuture(), nullptr);
    if (!result.error.ok()) {
      SetPeerErrorLocked(peer, result.error);
      break;
    }
    if (!result.completed) continue;  // Interrupted: the loop condition decides.
    const ControlMessage message = state.control_in;
    if (!closing_ && !aborted_) {
      absl::Status posted = PostControlRecvLocked(peer);
      if (!posted.ok()) SetPeerErrorLocked(peer, posted);
    }
    HandleControlLocked(peer, message);
  }
}

void Endpoint::HandleControlLocked(int peer, const ControlMessage& message) {
  Peer& state = peers_[peer];
  changed_.SignalAll();
  if (closing_ || aborted_) return;  // Nothing may be posted any more.
  if (message.magic != kControlMagic) {
    SetPeerErrorLocked(
        peer, absl::InternalError(absl::StrFormat("protocol error: control message with magic 0x%x",
                                                  message.magic)));
    return;
  }
  switch (static_cast<ControlKind>(message.kind)) {
    case ControlKind::kData: {
      const Announcement announcement{message.bytes, message.id};
      auto waiting = state.unmatched_recvs.find(message.tag);
      if (waiting == state.unmatched_recvs.end()) {
        state.unmatched_sends[message.tag].push_back(announcement);
        return;
      }
      std::shared_ptr<Op> op = std::move(waiting->second.front());
      waiting->second.pop_front();
      if (waiting->second.empty()) state.unmatched_recvs.erase(waiting);
      if (op->state == OpState::kUnmatched) MatchLocked(*op, announcement).IgnoreError();
      return;
    }
    case ControlKind::kReject: {
      auto sent = state.sends.find(message.id);
      if (sent == state.sends.end()) return;
      Op& op = *sent->second;
      if (op.state != OpState::kPosted) return;
      FailLocked(op, absl::StatusCode::kInternal,
                 absl::StrFormat("rank %d expected %d bytes for tag %s, this send has %d", peer,
                                 message.bytes, Hex(op.tag), op.bytes));
      for (ActiveWait* wait : active_waits_) {
        if (wait->op == &op) InterruptLocked(wait, Interrupt::kReject);
      }
      return;
    }
    case ControlKind::kBarrier:
      barrier_arrivals_.insert({message.id, message.tag});
      return;
  }
  SetPeerErrorLocked(peer, absl::InternalError(absl::StrFormat(
                               "protocol error: control message of kind %d", message.kind)));
}

void Endpoint::CompleteLocked(Op& op) {
  op.state = OpState::kDone;
  op.payload.reset();
  op.control_buffer.reset();
  if (!op.internal) {
    if (op.direction == Direction::kSend) {
      counters_.CountSent(op.bytes);
      peers_[op.peer].sends.erase(op.id);
    } else {
      counters_.CountReceived(op.bytes);
    }
  }
  outstanding_.erase(&op);  // Last: it may hold the last reference to op.
}

void Endpoint::FailLocked(Op& op, absl::StatusCode code, absl::string_view message) {
  op.state = OpState::kFailed;
  op.error = absl::Status(code, absl::StrFormat("%s failed: %s", op.label, message));
}

absl::Status Endpoint::TimeoutError(const Op& op, absl::Duration timeout) const {
  const char* hint = "";
  if (op.direction == Direction::kRecv) {
    hint = op.state == OpState::kUnmatched ? "the sender has not sent it yet"
                                           : "the data is still arriving";
  } else {
    hint = "the receiver has not taken it yet";
  }
  return adapter::TimedOut(op.label, timeout, hint);
}

void Endpoint::SetPeerErrorLocked(int peer, const absl::Status& status) {
  Peer& state = peers_[peer];
  if (!state.error.ok()) return;
  state.error = absl::Status(
      status.code(), absl::StrFormat("connection to rank %d failed: %s", peer, status.message()));
  changed_.SignalAll();
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
    watchdog_wake_.WaitWithDeadline(&mu_, next);
  }
}

// The numeric addresses `hostname` resolves to, in getaddrinfo's order. gloo resolves names
// itself, but when a name does not resolve it reads an uninitialized result and crashes; given
// a numeric address, its lookup cannot fail.
absl::StatusOr<std::vector<std::string>> NumericAddresses(const std::string& hostname) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rv = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot resolve \"%s\": %s", hostname, gai_strerror(rv)));
  }
  std::vector<std::string> addresses;
  for (const addrinfo* info = result; info != nullptr; info = info->ai_next) {
    char host[NI_MAXHOST];
    if (getnameinfo(info->ai_addr, info->ai_addrlen, host, sizeof(host), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      addresses.emplace_back(host);
    }
  }
  freeaddrinfo(result);
  if (addresses.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("\"%s\" has no address", hostname));
  }
  return addresses;
}

// A TCP device bound to the first address of `hostname` that can be bound.
absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateDevice(
    const std::string& hostname) {
  ASSIGN_OR_RETURN(const std::vector<std::string> addresses, NumericAddresses(hostname));
  std::string errors;
  for (const std::string& address : addresses) {
    try {
      ::gloo::transport::tcp::attr attr;
      attr.hostname = address;
      return ::gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", address, ": ", e.what());
    }
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("cannot bind to an address of \"%s\": %s", hostname, errors));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateGlooTransport(const GlooOptions& options,
                                                               RendezvousStore* store) {
  RETURN_IF_ERROR(ValidateConnectOptions("CreateGlooTransport", options, store));

  absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> device =
      CreateDevice(options.hostname);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrFormat("rank %d: %s", options.rank, device.status().message()));
  }

  auto context = std::make_shared<::gloo::rendezvous::Context>(options.rank, options.world_size);
  // gloo waits up to five times its context timeout for a TCP connection to open (and uses
  // the timeout for nothing else here: every wait on a buffer passes its own).
  const auto connect_wait = std::max(std::chrono::milliseconds(1),
                                     absl::ToChronoMilliseconds(options.connect_timeout) / 5);
  context->setTimeout(connect_wait);
  gloo_internal::StoreAdapter adapter(store, options.key_prefix,
                                      absl::Now() + options.connect_timeout);
  try {
    context->connectFullMesh(adapter, *device);
  } catch (const std::exception& e) {
    const absl::Status& store_error = adapter.status();
    if (!store_error.ok()) {
      return absl::Status(
          store_error.code(),
          absl::StrFormat("rank %d: gloo rendezvous (connect_timeout %s) failed: %s", options.rank,
                          absl::FormatDuration(options.connect_timeout), store_error.message()));
    }
    return absl::UnavailableError(absl::StrFormat(
        "rank %d: connecting to the other ranks failed: %s", options.rank, e.what()));
  }

  auto endpoint = std::make_shared<Endpoint>(options.rank, options.world_size, std::move(context));
  endpoint->Start();
  return std::unique_ptr<Transport>(
      new adapter::EndpointTransport<Endpoint, Op>(GlooDescriptor(), std::move(endpoint)));
}

}  // namespace stagecoach::transport
