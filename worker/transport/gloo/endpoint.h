// Internal to the Gloo backend (gloo_transport.cc, endpoint.cc, endpoint_control.cc): the
// Endpoint that carries a Gloo transport's transfers, its wire format and its ops.
//
// Protocol: receiver-announced, sender-matched. Each rank keeps kControlRing receives posted on
// kControlSlot per peer, served by a control thread per peer. Recv(data, n, peer, tag) posts the
// payload receive at once on a slot of its own, kPayloadSlotBase + id (id counts the receives
// from that peer), then announces it to the sender with a 32-byte ControlMessage {kRecvPosted,
// tag, n, id}. Gloo tells the sender about a posted receive (its recv-ready notice) before that
// announcement, on the same connection. The sender matches the announcement with the oldest
// unmatched Send to that peer with that tag (in Send itself if the announcement came first,
// else on its control thread when it comes) and, only if both byte counts agree, posts the
// payload send on the announced slot: gloo never sees a send of another size than its receive,
// and since the receive is already posted, gloo writes the payload at once. On a mismatch the
// send fails ("rank q expected N bytes for tag t, this send has M") and a {kReject} message
// fails the receive ("expected N bytes from rank p tag t, got M"); nothing is ever sent to that
// receive's slot, so its buffer is never written. A RecvUpTo announces {kRecvPostedUpTo}: a send
// of at most its bytes matches it, and gloo reads the shorter payload into the start of the
// posted buffer (its receive accepts a payload up to the posted size). User tags travel in control
// messages and never become slots, so every uint64 tag is valid. Barrier is a dissemination barrier
// of {kBarrier} control messages.
//
// Why this way round: a pipeline's receiver usually posts its receive before the data is ready
// (the lowered action lists put RECV_F and RECV_B ahead of the compute that needs them), so the
// payload travels the moment the sender's Send runs, with no thread between (PyTorch's
// isend/irecv on gloo behave so). Only a send that comes first waits for the announcement and
// the sender's control thread.
//
// A send's Work completes when its payload is written to the socket; a receive's when the
// payload has arrived. Stats count a transfer when it is seen complete.
//
// Send completion: a thread per peer waits, oldest first, for the sends posted to gloo for that
// peer (payloads once matched, and control messages), so that a send completes (and Work::Done
// says so) without its caller waiting; the caller can then release the send's buffer early. A
// receive completes in its caller's Wait.
//
// Waiting: a wait on a gloo buffer blocks without a timeout and is registered in
// active_waits_; a watchdog thread interrupts those past their deadline, Abort all of them,
// a reject the receive it fails. A timed-out transfer stays posted: waiting again may complete
// it. One thread at a time waits on an op's gloo buffer (Op::waited_on); a second one, e.g. the
// caller while the completion thread waits, waits on the op's own condition variable, which
// every change of the op's state signals (so a change wakes only the op's waiters).
//
// Teardown: Abort resets every connection (closeConnections; gloo unregisters each socket from
// its event loop and waits for the loop to tick, so once Abort returns gloo touches no user
// buffer). The destructor interrupts every wait and stops the threads. After Abort, or with
// Works not completed, it resets the connections the same way; otherwise (every Work
// completed, as after a Barrier, whatever control messages are still to be reaped) it closes
// them gracefully, so that the last control messages written still reach peers that have not
// read them yet. It destroys each connection before
// the gloo buffers still posted on it. Works may outlive their transport; Wait then returns
// CANCELLED.
#pragma once

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/adapter.h"
#include "worker/transport/transport.h"

namespace stagecoach::transport::gloo_internal {

using GlooBuffer = ::gloo::transport::UnboundBuffer;

constexpr uint64_t kControlSlot = 1;
// Control receives kept posted per peer: a peer may send this many control messages before
// the control thread has taken the first.
constexpr int kControlRing = 16;
constexpr uint64_t kPayloadSlotBase = uint64_t{1} << 63;
constexpr uint32_t kControlMagic = 0x31474353;  // "SCG1"

// What a gloo wait is given instead of a timeout (gloo's timeout would close the context).
constexpr std::chrono::milliseconds kGlooForever = std::chrono::hours(24 * 365);
// The least time a wait on a gloo buffer gets, so that Wait(0) still sees a finished transfer.
constexpr absl::Duration kMinGlooWait = absl::Milliseconds(1);

// kRecvPostedUpTo: as kRecvPosted, for a receive that takes a send of at most `bytes` bytes
// (Transport::RecvUpTo); gloo reads a shorter payload into the posted buffer.
enum class ControlKind : uint32_t {
  kRecvPosted = 1,
  kReject = 2,
  kBarrier = 3,
  kRecvPostedUpTo = 4
};

// Wire format, host byte order: every rank of a job runs the same build.
struct ControlMessage {
  uint32_t magic = kControlMagic;
  uint32_t kind = 0;
  uint64_t tag = 0;    // kRecvPosted, kReject: the user's tag. kBarrier: the round.
  uint64_t bytes = 0;  // kRecvPosted: the bytes the receive takes (its most, for kRecvPostedUpTo).
                       // kReject: the send's bytes.
  uint64_t id = 0;     // kRecvPosted, kReject: the receive's id. kBarrier: the barrier's number.
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

// kUnmatched: a send whose receive has not been announced yet. kPosted: posted to gloo.
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
  const bool internal;      // A control message: not counted in stats.
  const std::string label;  // "rank 1: receive from rank 0 (tag 0x7, 64 bytes)"

  OpState state = OpState::kUnmatched;
  bool up_to = false;  // A receive that takes a send of at most `bytes` (RecvUpTo).
  absl::Status error;  // kFailed.
  // The receive's id: its payload's slot is kPayloadSlotBase + id. A user receive's own, a
  // user send's once matched.
  uint64_t id = 0;
  ControlMessage control;              // Control messages: what `buffer` sends.
  std::unique_ptr<GlooBuffer> buffer;  // What is posted to gloo; released when done.
  bool waited_on = false;              // A thread is in WaitGlooLocked for `buffer`.
  absl::CondVar changed;               // Signalled on every change of state or waited_on.
};

// Removes and returns the oldest entry queued under `tag`, if any (dropping the emptied queue).
template <typename T>
std::optional<T> TakeOldest(std::map<uint64_t, std::deque<T>>& queues, uint64_t tag) {
  auto it = queues.find(tag);
  if (it == queues.end()) return std::nullopt;
  T oldest = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues.erase(it);
  return oldest;
}

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
  // A receive that takes a send of at most `max_bytes` (Transport::RecvUpTo).
  absl::StatusOr<std::shared_ptr<Op>> RecvUpTo(void* data, size_t max_bytes, int peer,
                                               uint64_t tag);
  absl::Status Wait(Op& op, absl::Duration timeout);
  // Whether a Wait on `op` would return at once: it completed or failed, or the transport was
  // aborted or is shutting down. Never blocks on gloo.
  bool Done(const Op& op) const;
  absl::Status Barrier(absl::Duration timeout);
  void Abort();

  TransferStats stats() const { return counters_.stats(); }

 private:
  // A receive the peer announced: its bytes (its most, when up_to) and id.
  struct Announcement {
    uint64_t bytes;
    uint64_t id;
    bool up_to = false;
  };
  absl::StatusOr<std::shared_ptr<Op>> PostRecv(void* data, size_t bytes, int peer, uint64_t tag,
                                               bool up_to);

  struct Peer {
    absl::Status error;  // OK while the connection works.
    uint64_t next_recv_id = 0;
    // The control receives, posted in ring order; the next message lands in next_control.
    std::array<ControlMessage, kControlRing> control_in;
    std::array<std::unique_ptr<GlooBuffer>, kControlRing> control_in_buffers;
    size_t next_control = 0;
    // The peer's receives announced before this rank's send, and this rank's sends posted
    // before their receive was announced, by tag, oldest first.
    std::map<uint64_t, std::deque<Announcement>> announced_recvs;
    std::map<uint64_t, std::deque<std::shared_ptr<Op>>> unmatched_sends;
    std::map<uint64_t, Op*> recvs;  // User receives by id, until done (so a reject finds them).
    // Sends posted to gloo, for the completion thread to wait for, oldest first, and its wake-up.
    std::deque<std::shared_ptr<Op>> sends_to_complete;
    absl::CondVar completion_wake;
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

  // Posts a send to the receive announced as `announcement`, or fails it on a size mismatch.
  // Returns an error only when gloo refused the send (the op is failed as well).
  absl::Status MatchLocked(const std::shared_ptr<Op>& op, const Announcement& announcement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts `op`'s buffer as a send on `slot` and queues it for the completion thread.
  absl::Status PostSendLocked(const std::shared_ptr<Op>& op, uint64_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts an internal control message to `peer`.
  absl::StatusOr<std::shared_ptr<Op>> SendControlLocked(int peer, const ControlMessage& message,
                                                        const std::string& label)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PostControlRecvLocked(int peer, size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  // Wakes every waiter: on each outstanding op (of `peer` only, if >= 0), the barrier, the
  // completion threads.
  void WakeAllLocked(int peer = -1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseConnectionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ControlLoop(int peer);
  // Waits for the sends to `peer` in posting order, so that they complete without a caller.
  void CompletionLoop(int peer);
  void WatchdogLoop();

  const int rank_;
  const int size_;

  mutable absl::Mutex mu_;
  // Signalled for Barrier and Shutdown: a barrier message, a peer error, Abort, Shutdown, a
  // wait leaving gloo while shutting down. Ops have their own (Op::changed).
  absl::CondVar changed_;
  absl::CondVar watchdog_wake_;  // A deadline before watchdog_until_, or Shutdown.
  // Until when the watchdog sleeps unless woken (it rescans every wait when it wakes): a wait
  // with a later deadline need not wake it. Before its first sleep, nothing needs to.
  absl::Time watchdog_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  std::shared_ptr<::gloo::rendezvous::Context> context_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown began.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;   // gloo released.
  bool connections_reset_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Peer> peers_
      ABSL_GUARDED_BY(mu_);  // Indexed by rank; never resized (Peer cannot move).
  // Ops not done yet, kept alive for gloo (which holds their buffers) even when their Work is
  // gone, until Shutdown.
  std::map<const Op*, std::shared_ptr<Op>> outstanding_ ABSL_GUARDED_BY(mu_);
  std::set<ActiveWait*> active_waits_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, uint64_t>> barrier_arrivals_ ABSL_GUARDED_BY(mu_);  // (n, round)
  uint64_t next_barrier_ ABSL_GUARDED_BY(mu_) = 0;

  adapter::TransferCounters counters_;

  std::vector<std::thread> threads_;  // Only Start and Shutdown touch it.
};

}  // namespace stagecoach::transport::gloo_internal
