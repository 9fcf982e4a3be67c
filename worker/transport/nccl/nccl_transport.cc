// The NCCL backend of Transport (factory.h): CUDA runtime API and NCCL C API only, no LibTorch.
//
// Channels. A channel is a communicator with a communication stream and a queue of its own.
// The world communicator (all ranks) is one; with NcclOptions::links each link adds a two-rank
// one, and Send and Recv pick the channel of (tag >> link_shift, peer), so that transfers of
// different links never wait for each other (one NCCL communicator runs its operations in
// order). Communicators are nonblocking (ncclConfig_t::blocking = 0): a blocking one may
// block the calling thread inside NCCL without a bound: in ncclCommInitRank until every rank
// joined, and in ncclGroupEnd of the first transfer between two ranks until the peer posts its
// side too (NCCL connects pairs lazily). With a nonblocking communicator those calls return
// ncclInProgress and NCCL finishes them on its own threads; NCCL's rule is then that no other
// NCCL call on the communicator, and no CUDA work on its stream, may be issued until
// ncclCommGetAsyncError reports ncclSuccess again. That rule is per communicator, so each
// channel tracks its own launch in progress.
//
// Creation. Rank 0 publishes the world communicator's ncclUniqueId in the rendezvous store as
// hex; every rank joins. Then, for each link, the lower rank of the pair publishes a unique id
// under "link/<link>/<lo>-<hi>" (all of its links first, then it reads the others', so no rank
// waits for one that waits for it), and each rank initializes all of its link communicators
// inside one ncclGroupStart/ncclGroupEnd, so that NCCL joins them concurrently and the order in
// which ranks list or reach them cannot deadlock. Everything is bounded by connect_timeout.
//
// Launches. Every Send and Recv is one NCCL group (a self Send and its Recv together, see
// below; a Barrier is a one-int ncclAllReduce on the world channel), appended to its channel's
// queue and handed to NCCL in posting order by PumpLocked, which the posting thread, every
// Wait and a pump thread call; per channel:
//   1. cudaStreamWaitEvent(comm stream, ready) for every op: `ready` was recorded on the
//      compute stream when the op was posted;
//   2. ncclGroupStart, ncclSend/ncclRecv/ncclAllReduce on the comm stream, ncclGroupEnd;
//   3. once the communicator reports ncclSuccess (at once, or after later polls while the
//      launch is the channel's `launching`), record a `done` event on the comm stream.
// The pump thread sleeps while nothing is queued or launching, and polls with a backoff (20 us
// to 1 ms) otherwise, so queued ops reach NCCL even while the caller computes.
//
// Waits. Wait polls (10 us to 1 ms backoff, lock released while sleeping): the op's state,
// ncclCommGetAsyncError of every communicator, and cudaEventQuery(done). When done,
// compute_stream waits for the event (cudaStreamWaitEvent) and the op counts in the stats. An
// asynchronous NCCL error on any communicator aborts all of them (kernels could otherwise
// hang) and fails every wait with it.
//
// Self-transfers (one-rank transports only). NCCL completes a send to self only when the
// matching receive is in the same group: posted as separate groups on one stream, the send
// would wait forever for a receive queued behind it. So a self Send or Recv is held until its
// other half (same tag, oldest first) is posted; the pair then joins the queue as one group.
// Both halves being known, a byte-count mismatch is detected before NCCL sees it.
//
// Abort and teardown. Abort sets aborted_ and calls ncclCommAbort on every communicator,
// which makes NCCL's kernels return, all under mu_, so a Wait that sees a `done` event
// complete before aborted_ is set saw a real completion (after ncclCommAbort an event
// completes for an aborted kernel too). The destructor stops the pump thread, then finalizes
// every idle channel's communicator (ncclCommFinalize flushes sends still in flight; all
// finalize together, under one timeout) and destroys it, and aborts the others.
// Works hold the Endpoint, so they may outlive the transport.
#include <algorithm>
#include <cstdint>
#include <deque>
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/util/status_macros.h"
#include "worker/transport/adapter.h"
#include "worker/transport/nccl/factory.h"
#include "worker/transport/nccl/nccl_util.h"

namespace stagecoach::transport {
namespace {

using adapter::Hex;

constexpr absl::Duration kWaitPollMin = absl::Microseconds(10);
constexpr absl::Duration kPumpPollMin = absl::Microseconds(20);
constexpr absl::Duration kPollMax = absl::Milliseconds(1);
// How long the destructor lets ncclCommFinalize flush before it aborts instead.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(5);

class Event {
 public:
  // An event on the current device, without timing.
  static absl::StatusOr<std::shared_ptr<Event>> Create() {
    cudaEvent_t event = nullptr;
    const cudaError_t error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (error != cudaSuccess) return CudaError("cudaEventCreateWithFlags", error);
    return std::shared_ptr<Event>(new Event(event));
  }
  ~Event() { cudaEventDestroy(event_); }  // Fails harmlessly once CUDA is torn down at exit.
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }

 private:
  explicit Event(cudaEvent_t event) : event_(event) {}
  const cudaEvent_t event_;
};

enum class Kind { kSend, kRecv, kBarrier };

enum class OpState {
  kHeld,       // A self-transfer whose other half has not been posted.
  kQueued,     // In its channel's queue, behind earlier ops not yet handed to NCCL.
  kLaunching,  // ncclGroupEnd returned ncclInProgress; NCCL is still issuing it.
  kIssued,     // On the comm stream; `done` completes with it.
  kDone,       // A Wait saw it complete.
  kFailed,
};

struct Op;

// The ops of one NCCL group.
using Launch = std::vector<std::shared_ptr<Op>>;

// A communicator with its own communication stream and launch queue: the world communicator
// or one link's. Fields after the constant ones are guarded by Endpoint::mu_.
struct Channel {
  Channel(std::string name, uint64_t link, int peer, int peer_in_comm, ncclComm_t comm,
          cudaStream_t stream)
      : name(std::move(name)),
        link(link),
        peer(peer),
        peer_in_comm(peer_in_comm),
        stream(stream),
        comm(comm) {}

  // The rank of `op`'s peer in this channel's communicator.
  int PeerInComm(const Op& op) const;

  const std::string name;  // "link 0x1000000 with rank 1"; "world communicator".
  const uint64_t link;     // Link channels only.
  const int peer;          // Link channels: the peer's rank in the job; -1 for the world.
  const int peer_in_comm;  // Link channels: the peer's rank in `comm` (0 or 1); -1 for the world.
  const cudaStream_t stream;

  ncclComm_t comm;  // Null once aborted or destroyed.
  std::deque<Launch> queue;
  std::optional<Launch> launching;
  std::shared_ptr<Event> last_done;  // Of the latest issued launch.
};

// One Send, Recv or Barrier. Fields after the constant ones are guarded by Endpoint::mu_.
struct Op {
  Op(Kind kind, int peer, uint64_t tag, size_t bytes, void* data, Channel* channel,
     std::string label)
      : kind(kind),
        peer(peer),
        tag(tag),
        bytes(bytes),
        data(data),
        channel(channel),
        label(std::move(label)) {}

  const Kind kind;
  const int peer;
  const uint64_t tag;
  const size_t bytes;
  void* const data;
  Channel* const channel;   // Owned by the Endpoint.
  const std::string label;  // "rank 1: receive from rank 0 (tag 0x7, 64 bytes)"

  OpState state = OpState::kQueued;
  absl::Status error;            // kFailed.
  std::shared_ptr<Event> ready;  // Recorded on the compute stream when posted.
  std::shared_ptr<Event> done;   // kIssued: recorded on the comm stream after its group.
};

int Channel::PeerInComm(const Op& op) const { return peer_in_comm >= 0 ? peer_in_comm : op.peer; }

class Endpoint {
 public:
  // channels[0] is the world channel, the others are links (when `options.links` is set).
  Endpoint(const NcclOptions& options, std::vector<std::unique_ptr<Channel>> channels,
           int* barrier_buffer, bool barrier_buffer_async)
      : rank_(options.rank),
        size_(options.world_size),
        device_(options.cuda_device),
        link_shift_(options.link_shift),
        has_links_(channels.size() > 1),
        compute_stream_(options.compute_stream == nullptr
                            ? cudaStreamLegacy
                            : static_cast<cudaStream_t>(options.compute_stream)),
        barrier_buffer_(barrier_buffer),
        barrier_buffer_async_(barrier_buffer_async),
        channels_(std::move(channels)) {
    for (size_t i = 1; i < channels_.size(); ++i) {
      routes_[{channels_[i]->link, channels_[i]->peer}] = channels_[i].get();
    }
  }

  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  void Start() {
    pump_ = std::thread([this] { PumpLoop(); });
  }
  void Shutdown();

  absl::StatusOr<std::shared_ptr<Op>> Send(const void* data, size_t bytes, int peer, uint64_t tag) {
    // NCCL reads, never writes, a send buffer.
    return Post(Kind::kSend, const_cast<void*>(data), bytes, peer, tag);
  }
  absl::StatusOr<std::shared_ptr<Op>> Recv(void* data, size_t bytes, int peer, uint64_t tag) {
    return Post(Kind::kRecv, data, bytes, peer, tag);
  }
  absl::Status Wait(Op& op, absl::Duration timeout);
  absl::Status Barrier(absl::Duration timeout);
  void Abort();

  TransferStats stats() const { return counters_.stats(); }

 private:
  absl::StatusOr<std::shared_ptr<Op>> Post(Kind kind, void* data, size_t bytes, int peer,
                                           uint64_t tag);
  Channel& world() const { return *channels_.front(); }
  // The channel of a transfer with `peer` (valid, not this rank unless world_size is 1) and
  // `tag`; INVALID_ARGUMENT when links are set and (link, peer) is not one of them.
  absl::StatusOr<Channel*> Route(int peer, uint64_t tag, absl::string_view label) const;
  // "link 0x1 with rank 1: " with links, "" without (one channel needs no name).
  std::string Where(const Channel& channel) const {
    return has_links_ ? absl::StrCat(channel.name, ": ") : std::string();
  }

  // The status of a Wait that cannot go on: the op failed, or the transport was aborted,
  // destroyed or failed. nullopt while the op may still complete.
  std::optional<absl::Status> FinalStatusLocked(const Op& op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One poll of `op`: pumps, checks the communicators, queries `done`. OK when it completed.
  std::optional<absl::Status> PollLocked(Op& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TimeoutError(const Op& op, absl::Duration timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Hands queued launches to NCCL, per channel until one is still in progress or the
  // channel's queue is empty.
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PumpChannelLocked(Channel& channel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartLaunchLocked(Channel& channel, Launch launch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinishLaunchLocked(Channel& channel, const Launch& launch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the transport on an asynchronous NCCL error of any communicator.
  void CheckAsyncErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the transport's failure and aborts every communicator. The first failure wins.
  void FailCommLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailChannelLocked(const Channel& channel, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FailCommLocked(WithPrefix(status, Where(channel)));
  }
  // Aborts every communicator not yet aborted or destroyed.
  void AbortAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool UsableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !aborted_ && !closing_ && comm_error_.ok();
  }
  // Whether some channel has a launch queued or in progress.
  bool BusyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pairs a self op with the oldest held op of the other direction and the same tag, or holds
  // it.
  void MatchSelfLocked(const std::shared_ptr<Op>& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Nothing queued, launching, held or running on `channel`.
  bool IdleLocked(const Channel& channel) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PumpLoop();

  const int rank_;
  const int size_;
  const int device_;
  const int link_shift_;
  const bool has_links_;
  const cudaStream_t compute_stream_;
  int* const barrier_buffer_;        // One int on device_.
  const bool barrier_buffer_async_;  // Allocated with cudaMallocAsync on the world stream.
  // channels_[0] is the world channel. The vector and routes_ are constant; the channels'
  // mutable fields are guarded by mu_.
  const std::vector<std::unique_ptr<Channel>> channels_;
  std::map<std::pair<uint64_t, int>, Channel*> routes_;  // (link, peer); set in the constructor.

  adapter::TransferCounters counters_;

  mutable absl::Mutex mu_;
  absl::CondVar pump_wake_;  // Signalled when the pump thread may have work, and on shutdown.
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status comm_error_ ABSL_GUARDED_BY(mu_);
  uint64_t issued_launches_ ABSL_GUARDED_BY(mu_) = 0;
  // Self-transfers waiting for their other half, by tag, oldest first (world channel).
  std::map<uint64_t, std::deque<std::shared_ptr<Op>>> held_sends_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::deque<std::shared_ptr<Op>>> held_recvs_ ABSL_GUARDED_BY(mu_);
  std::thread pump_;
};

absl::StatusOr<Channel*> Endpoint::Route(int peer, uint64_t tag, absl::string_view label) const {
  if (!has_links_) return &world();
  const uint64_t link = tag >> link_shift_;
  auto it = routes_.find({link, peer});
  if (it != routes_.end()) return it->second;
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: link %s (tag >> %d) with rank %d is not one of this transport's links",
                      label, Hex(link), link_shift_, peer));
}

absl::StatusOr<std::shared_ptr<Op>> Endpoint::Post(Kind kind, void* data, size_t bytes, int peer,
                                                   uint64_t tag) {
  const bool send = kind == Kind::kSend;
  std::string label =
      adapter::TransferLabel(rank_, send ? "send to" : "receive from", peer, tag, bytes);
  if (peer < 0 || peer >= size_ || (peer == rank_ && size_ > 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: peer %d is %s", label, peer,
                        peer == rank_ ? "this rank" : absl::StrFormat("not in [0, %d)", size_)));
  }
  if (data == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": null buffer"));
  }
  absl::StatusOr<Channel*> channel = Route(peer, tag, label);
  if (!channel.ok()) return channel.status();
  if (has_links_) {  // "(tag 0x10000003, 64 bytes, link 0x1)"
    label.insert(label.size() - 1, absl::StrCat(", link ", Hex((*channel)->link)));
  }
  auto op = std::make_shared<Op>(kind, peer, tag, bytes, data, *channel, std::move(label));

  DeviceGuard guard(device_);
  absl::MutexLock lock(&mu_);
  if (aborted_) return absl::CancelledError(absl::StrCat(op->label, ": the transport was aborted"));
  if (!comm_error_.ok()) return WithPrefix(comm_error_, absl::StrCat(op->label, ": "));
  if (bytes == 0) {
    op->state = OpState::kDone;  // Both sides agree on the count, so both skip NCCL.
    return op;
  }
  if (!guard.status().ok()) return WithPrefix(guard.status(), absl::StrCat(op->label, ": "));
  absl::StatusOr<std::shared_ptr<Event>> ready = Event::Create();
  if (!ready.ok()) return WithPrefix(ready.status(), absl::StrCat(op->label, ": "));
  const cudaError_t recorded = cudaEventRecord((*ready)->get(), compute_stream_);
  if (recorded != cudaSuccess) {
    return WithPrefix(CudaError("cudaEventRecord on the compute stream", recorded),
                      absl::StrCat(op->label, ": "));
  }
  op->ready = std::move(ready).value();
  if (peer == rank_) {
    MatchSelfLocked(op);
  } else {
    op->channel->queue.push_back({op});
  }
  PumpLocked();
  pump_wake_.Signal();
  return op;
}

void Endpoint::MatchSelfLocked(const std::shared_ptr<Op>& op) {
  const bool send = op->kind == Kind::kSend;
  auto& others = send ? held_recvs_ : held_sends_;
  auto it = others.find(op->tag);
  if (it == others.end()) {
    op->state = OpState::kHeld;
    (send ? held_sends_ : held_recvs_)[op->tag].push_back(op);
    return;
  }
  std::shared_ptr<Op> other = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) others.erase(it);
  const std::shared_ptr<Op>& send_op = send ? op : other;
  const std::shared_ptr<Op>& recv_op = send ? other : op;
  if (send_op->bytes != recv_op->bytes) {
    recv_op->state = OpState::kFailed;
    recv_op->error = absl::InternalError(
        absl::StrFormat("%s failed: expected %d bytes from rank %d tag %s, got %d", recv_op->label,
                        recv_op->bytes, rank_, Hex(recv_op->tag), send_op->bytes));
    send_op->state = OpState::kFailed;
    send_op->error = absl::InternalError(
        absl::StrFormat("%s failed: rank %d expected %d bytes for tag %s, this send has %d",
                        send_op->label, rank_, recv_op->bytes, Hex(send_op->tag), send_op->bytes));
    return;
  }
  send_op->state = OpState::kQueued;
  recv_op->state = OpState::kQueued;
  world().queue.push_back({send_op, recv_op});  // Self-transfers exist only without links.
}

void Endpoint::PumpLocked() {
  for (const std::unique_ptr<Channel>& channel : channels_) {
    if (!UsableLocked()) return;
    PumpChannelLocked(*channel);
  }
}

void Endpoint::PumpChannelLocked(Channel& channel) {
  while (UsableLocked() && (channel.launching.has_value() || !channel.queue.empty())) {
    // The communicator must report ncclSuccess before the next NCCL call or CUDA work on its
    // stream; ncclInProgress means NCCL is still issuing the launch in progress.
    absl::StatusOr<bool> ready = CommReady(
        channel.comm, channel.launching.has_value() ? "issuing an NCCL group (asynchronous)"
                                                    : "NCCL (asynchronous error)");
    if (!ready.ok()) {
      FailChannelLocked(channel, ready.status());
      return;
    }
    if (!*ready) return;
    if (channel.launching.has_value()) {
      Launch launch = std::move(*channel.launching);
      channel.launching.reset();
      absl::Status finished = FinishLaunchLocked(channel, launch);
      if (!finished.ok()) {
        FailChannelLocked(channel, finished);
        return;
      }
      continue;
    }
    Launch launch = std::move(channel.queue.front());
    channel.queue.pop_front();
    StartLaunchLocked(channel, std::move(launch));
  }
}

void Endpoint::StartLaunchLocked(Channel& channel, Launch launch) {
  for (const std::shared_ptr<Op>& op : launch) {
    if (op->ready == nullptr) continue;
    const cudaError_t error = cudaStreamWaitEvent(channel.stream, op->ready->get(), 0);
    if (error != cudaSuccess) {
      FailChannelLocked(
          channel, WithPrefix(CudaError("cudaStreamWaitEvent on the communication stream", error),
                              absl::StrCat(op->label, ": ")));
      return;
    }
  }
  ncclComm_t comm = channel.comm;
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) {
    FailChannelLocked(channel, NcclError("ncclGroupStart", result, comm));
    return;
  }
  absl::Status posted;
  for (const std::shared_ptr<Op>& op : launch) {
    switch (op->kind) {
      case Kind::kSend:
        result =
            ncclSend(op->data, op->bytes, ncclUint8, channel.PeerInComm(*op), comm, channel.stream);
        if (result != ncclSuccess && result != ncclInProgress && posted.ok()) {
          posted = WithPrefix(NcclError("ncclSend", result, comm), absl::StrCat(op->label, ": "));
        }
        break;
      case Kind::kRecv:
        result =
            ncclRecv(op->data, op->bytes, ncclUint8, channel.PeerInComm(*op), comm, channel.stream);
        if (result != ncclSuccess && result != ncclInProgress && posted.ok()) {
          posted = WithPrefix(NcclError("ncclRecv", result, comm), absl::StrCat(op->label, ": "));
        }
        break;
      case Kind::kBarrier:
        result = ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclInt32, ncclMax, comm,
                               channel.stream);
        if (result != ncclSuccess && result != ncclInProgress && posted.ok()) {
          posted =
              WithPrefix(NcclError("ncclAllReduce", result, comm), absl::StrCat(op->label, ": "));
        }
        break;
    }
  }
  result = ncclGroupEnd();  // Always closes the group, also after an error inside it.
  if (!posted.ok()) {
    FailChannelLocked(channel, posted);
    return;
  }
  if (result == ncclSuccess) {
    absl::Status finished = FinishLaunchLocked(channel, launch);
    if (!finished.ok()) FailChannelLocked(channel, finished);
    return;
  }
  if (result == ncclInProgress) {
    for (const std::shared_ptr<Op>& op : launch) op->state = OpState::kLaunching;
    channel.launching = std::move(launch);
    return;
  }
  FailChannelLocked(channel, NcclError("ncclGroupEnd", result, comm));
}

absl::Status Endpoint::FinishLaunchLocked(Channel& channel, const Launch& launch) {
  absl::StatusOr<std::shared_ptr<Event>> done = Event::Create();
  if (!done.ok()) return done.status();
  const cudaError_t error = cudaEventRecord((*done)->get(), channel.stream);
  if (error != cudaSuccess) return CudaError("cudaEventRecord on the communication stream", error);
  for (const std::shared_ptr<Op>& op : launch) {
    op->state = OpState::kIssued;
    op->done = *done;
  }
  channel.last_done = *done;
  ++issued_launches_;
  return absl::OkStatus();
}

void Endpoint::CheckAsyncErrorLocked() {
  for (const std::unique_ptr<Channel>& channel : channels_) {
    if (!UsableLocked()) return;
    absl::StatusOr<bool> ready = CommReady(channel->comm, "NCCL (asynchronous error)");
    if (!ready.ok()) FailChannelLocked(*channel, ready.status());
  }
}

void Endpoint::AbortAllLocked() {
  for (const std::unique_ptr<Channel>& channel : channels_) {
    if (channel->comm == nullptr) continue;
    ncclCommAbort(channel->comm);
    channel->comm = nullptr;
  }
}

void Endpoint::FailCommLocked(const absl::Status& status) {
  if (!comm_error_.ok()) return;
  comm_error_ =
      absl::Status(status.code(), absl::StrCat("the NCCL transport failed: ", status.message()));
  AbortAllLocked();
  pump_wake_.SignalAll();
}

std::optional<absl::Status> Endpoint::FinalStatusLocked(const Op& op) const {
  if (op.state == OpState::kDone) return absl::OkStatus();
  if (op.state == OpState::kFailed) return op.error;
  if (closing_ || aborted_) return adapter::Cancelled(op.label, closing_);
  if (!comm_error_.ok()) return WithPrefix(comm_error_, absl::StrCat(op.label, " failed: "));
  return std::nullopt;
}

std::optional<absl::Status> Endpoint::PollLocked(Op& op) {
  if (std::optional<absl::Status> final_status = FinalStatusLocked(op)) return final_status;
  PumpLocked();
  CheckAsyncErrorLocked();
  if (std::optional<absl::Status> final_status = FinalStatusLocked(op)) return final_status;
  if (op.state != OpState::kIssued) return std::nullopt;
  const cudaError_t queried = cudaEventQuery(op.done->get());
  if (queried == cudaErrorNotReady) return std::nullopt;
  if (queried != cudaSuccess) {
    FailChannelLocked(*op.channel, CudaError("cudaEventQuery", queried));
    return FinalStatusLocked(op);
  }
  if (op.kind != Kind::kBarrier) {
    const cudaError_t waited = cudaStreamWaitEvent(compute_stream_, op.done->get(), 0);
    if (waited != cudaSuccess) {
      op.state = OpState::kFailed;
      op.error = WithPrefix(CudaError("cudaStreamWaitEvent on the compute stream", waited),
                            absl::StrCat(op.label, " failed: "));
      return op.error;
    }
  }
  op.state = OpState::kDone;
  op.ready.reset();
  op.done.reset();
  if (op.kind == Kind::kSend) counters_.CountSent(op.bytes);
  if (op.kind == Kind::kRecv) counters_.CountReceived(op.bytes);
  return absl::OkStatus();
}

absl::Status Endpoint::TimeoutError(const Op& op, absl::Duration timeout) const {
  std::string hint;
  if (op.kind == Kind::kBarrier) {
    hint = has_links_ ? "not every rank has entered it"
                      : "not every rank has entered it, or a transfer this rank posted earlier "
                        "is pending";
    if (op.state == OpState::kLaunching) absl::StrAppend(&hint, "; NCCL is still connecting");
    return adapter::TimedOut(op.label, timeout, hint);
  }
  // With links, the label names the op's link; a channel holds one link with one peer.
  const char* channel = has_links_ ? " on this link" : "";
  switch (op.state) {
    case OpState::kHeld:
      hint = op.kind == Kind::kSend ? "no receive with this tag has been posted on this rank"
                                    : "no send with this tag has been posted on this rank";
      break;
    case OpState::kQueued:
      hint = absl::StrCat("queued behind an earlier transfer of this rank", channel,
                          " that NCCL has not issued yet");
      break;
    case OpState::kLaunching:
      hint = absl::StrFormat(
          "NCCL is still issuing it; the first transfer between two ranks%s connects them, "
          "which needs rank %d to post a transfer to this rank%s too",
          channel, op.peer, channel);
      break;
    default:
      hint = absl::StrFormat(
          "rank %d has not posted the matching %s, or a transfer this rank posted earlier%s is "
          "pending; NCCL pairs transfers %s in posting order",
          op.peer, op.kind == Kind::kSend ? "receive" : "send", channel,
          has_links_ ? "per link" : "per peer");
      break;
  }
  return adapter::TimedOut(op.label, timeout, hint);
}

absl::Status Endpoint::Wait(Op& op, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = kWaitPollMin;
  DeviceGuard guard(device_);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (!guard.status().ok()) {
        if (std::optional<absl::Status> final_status = FinalStatusLocked(op)) return *final_status;
        return WithPrefix(guard.status(), absl::StrCat(op.label, ": "));
      }
      if (std::optional<absl::Status> status = PollLocked(op)) return *status;
      const absl::Time now = absl::Now();
      if (now >= deadline) return TimeoutError(op, timeout);
      pause = std::min(pause, deadline - now);
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, kPollMax);
  }
}

absl::Status Endpoint::Barrier(absl::Duration timeout) {
  std::shared_ptr<Op> op;
  {
    DeviceGuard guard(device_);
    absl::MutexLock lock(&mu_);
    const std::string label = absl::StrFormat("rank %d: barrier", rank_);
    if (aborted_) return adapter::Cancelled(label, /*destroyed=*/false);
    if (!comm_error_.ok()) return WithPrefix(comm_error_, label + " failed: ");
    if (!guard.status().ok()) return WithPrefix(guard.status(), label + ": ");
    op = std::make_shared<Op>(Kind::kBarrier, -1, 0, 0, nullptr, &world(), label);
    world().queue.push_back({op});
    PumpLocked();
    pump_wake_.Signal();
  }
  return Wait(*op, timeout);
}

void Endpoint::Abort() {
  DeviceGuard guard(device_);
  absl::MutexLock lock(&mu_);
  if (aborted_ || closing_) return;
  aborted_ = true;
  AbortAllLocked();
  pump_wake_.SignalAll();
}

bool Endpoint::BusyLocked() const {
  for (const std::unique_ptr<Channel>& channel : channels_) {
    if (channel->launching.has_value() || !channel->queue.empty()) return true;
  }
  return false;
}

bool Endpoint::IdleLocked(const Channel& channel) const {
  if (channel.launching.has_value() || !channel.queue.empty()) return false;
  if (&channel == &world() && (!held_sends_.empty() || !held_recvs_.empty())) return false;
  // The comm stream runs launches in order: the latest done means all are.
  return channel.last_done == nullptr || cudaEventQuery(channel.last_done->get()) == cudaSuccess;
}

void Endpoint::PumpLoop() {
  DeviceGuard guard(device_);
  absl::MutexLock lock(&mu_);
  absl::Duration pause = kPumpPollMin;
  while (!closing_) {
    const uint64_t issued = issued_launches_;
    if (guard.status().ok()) PumpLocked();
    if (BusyLocked() && UsableLocked()) {
      // Poll soon after progress, then back off.
      pause = issued_launches_ != issued ? kPumpPollMin : std::min(pause * 2, kPollMax);
      pump_wake_.WaitWithTimeout(&mu_, pause);
    } else {
      pause = kPumpPollMin;
      pump_wake_.Wait(&mu_);
    }
  }
}

void Endpoint::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    pump_wake_.SignalAll();
  }
  if (pump_.joinable()) pump_.join();

  DeviceGuard guard(device_);
  absl::MutexLock lock(&mu_);
  // Finalize every idle communicator at once (each flushes on NCCL's threads), then destroy
  // those that finalized in time and abort the rest.
  std::vector<ncclComm_t> idle;
  for (const std::unique_ptr<Channel>& channel : channels_) {
    if (channel->comm == nullptr || !IdleLocked(*channel)) continue;
    idle.push_back(channel->comm);
    channel->comm = nullptr;
  }
  FinalizeAndDestroy(idle, kFinalizeTimeout);
  AbortAllLocked();  // The busy ones.
  // Queued and held ops never reached NCCL; launches in progress were aborted with them.
  for (const std::unique_ptr<Channel>& channel : channels_) {
    channel->queue.clear();
    channel->launching.reset();
  }
  held_sends_.clear();
  held_recvs_.clear();
  if (barrier_buffer_ != nullptr) {
    if (barrier_buffer_async_) {
      cudaFreeAsync(barrier_buffer_, world().stream);  // Stream-ordered: no device sync.
    } else {
      cudaFree(barrier_buffer_);
    }
  }
  for (const std::unique_ptr<Channel>& channel : channels_) {
    // Returns at once; CUDA releases the stream when its work is done.
    cudaStreamDestroy(channel->stream);
  }
}

std::string LinkName(const NcclLink& link) {
  return absl::StrFormat("link %s with rank %d", Hex(link.link), link.peer);
}

// Creates this rank's communicator of every link (element i is links[i]'s), all joined, or
// none: see "Creation" above. Bounded by `deadline`.
absl::StatusOr<std::vector<ncclComm_t>> CreateLinkComms(const NcclOptions& options,
                                                        RendezvousStore* store,
                                                        absl::Time deadline) {
  const std::vector<NcclLink>& links = options.links;
  const size_t n = links.size();
  auto key_of = [&](const NcclLink& link) {
    return absl::StrFormat("%slink/%s/%d-%d", options.key_prefix, Hex(link.link),
                           std::min(options.rank, link.peer), std::max(options.rank, link.peer));
  };
  std::vector<ncclUniqueId> ids(n);
  // Publish the ids of the links this rank leads before waiting for any other's.
  for (size_t i = 0; i < n; ++i) {
    if (options.rank > links[i].peer) continue;
    absl::StatusOr<ncclUniqueId> id = PublishUniqueId(store, key_of(links[i]));
    if (!id.ok()) return WithPrefix(id.status(), absl::StrCat(LinkName(links[i]), ": "));
    ids[i] = *id;
  }
  for (size_t i = 0; i < n; ++i) {
    if (options.rank < links[i].peer) continue;
    absl::StatusOr<ncclUniqueId> id =
        ReadUniqueId(store, key_of(links[i]), links[i].peer,
                     std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!id.ok()) return WithPrefix(id.status(), absl::StrCat(LinkName(links[i]), ": "));
    ids[i] = *id;
  }

  // One group: NCCL joins them all concurrently, whatever order the peers create theirs in.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<ncclComm_t> comms(n, nullptr);
  absl::Status error;
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) return NcclError("ncclGroupStart", result, nullptr);
  for (size_t i = 0; i < n; ++i) {
    result =
        ncclCommInitRankConfig(&comms[i], 2, ids[i], options.rank < links[i].peer ? 0 : 1, &config);
    if (result != ncclSuccess && result != ncclInProgress && error.ok()) {
      error = WithPrefix(NcclError("ncclCommInitRankConfig", result, comms[i]),
                         absl::StrCat(LinkName(links[i]), ": "));
    }
  }
  result = ncclGroupEnd();
  if (result != ncclSuccess && result != ncclInProgress && error.ok()) {
    error = NcclError("ncclGroupEnd (creating the link communicators)", result, nullptr);
  }
  std::vector<bool> joined(n, false);
  absl::Duration pause = absl::Microseconds(100);
  while (error.ok()) {
    std::vector<std::string> pending;
    for (size_t i = 0; i < n && error.ok(); ++i) {
      if (joined[i]) continue;
      if (comms[i] == nullptr) {
        error = absl::InternalError(
            absl::StrCat(LinkName(links[i]), ": ncclCommInitRankConfig returned no communicator"));
        break;
      }
      absl::StatusOr<bool> ready = CommReady(comms[i], "ncclCommInitRankConfig (asynchronous)");
      if (!ready.ok()) {
        error = WithPrefix(ready.status(), absl::StrCat(LinkName(links[i]), ": "));
      } else if (*ready) {
        joined[i] = true;
      } else {
        pending.push_back(LinkName(links[i]));
      }
    }
    if (!error.ok() || pending.empty()) break;
    if (absl::Now() >= deadline) {
      error = absl::DeadlineExceededError(absl::StrFormat(
          "the NCCL communicators of %s were not joined by their peers within %s",
          absl::StrJoin(pending, ", "), absl::FormatDuration(options.connect_timeout)));
      break;
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
  if (!error.ok()) {
    for (ncclComm_t comm : comms) {
      if (comm != nullptr) ncclCommAbort(comm);
    }
    return error;
  }
  return comms;
}

absl::StatusOr<std::unique_ptr<Transport>> Create(const NcclOptions& options,
                                                  RendezvousStore* store) {
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  RETURN_IF_ERROR(CheckCudaDevice(options.cuda_device));
  DeviceGuard guard(options.cuda_device);
  if (!guard.status().ok()) return guard.status();
  ASSIGN_OR_RETURN(ncclComm_t comm, JoinCommunicator(options, store, deadline));

  // comms[0] is the world's, then one per link.
  std::vector<ncclComm_t> comms = {comm};
  if (!options.links.empty()) {
    absl::StatusOr<std::vector<ncclComm_t>> link_comms = CreateLinkComms(options, store, deadline);
    if (!link_comms.ok()) {
      ncclCommAbort(comm);
      return link_comms.status();
    }
    comms.insert(comms.end(), link_comms->begin(), link_comms->end());
  }
  std::vector<cudaStream_t> streams;
  auto fail = [&](absl::Status status) {
    for (ncclComm_t c : comms) ncclCommAbort(c);
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    return status;
  };
  for (size_t i = 0; i < comms.size(); ++i) {
    cudaStream_t stream = nullptr;
    const cudaError_t error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (error != cudaSuccess) return fail(CudaError("cudaStreamCreateWithFlags", error));
    streams.push_back(stream);
  }
  // The barrier's int. Stream-ordered where supported, so that freeing it never waits for the
  // whole device.
  int pools = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, options.cuda_device) !=
      cudaSuccess) {
    cudaGetLastError();
    pools = 0;
  }
  void* barrier_buffer = nullptr;
  cudaError_t error = pools != 0 ? cudaMallocAsync(&barrier_buffer, sizeof(int), streams[0])
                                 : cudaMalloc(&barrier_buffer, sizeof(int));
  if (error == cudaSuccess) error = cudaMemsetAsync(barrier_buffer, 0, sizeof(int), streams[0]);
  if (error != cudaSuccess) {
    return fail(CudaError(pools != 0 ? "cudaMallocAsync" : "cudaMalloc", error));
  }

  std::vector<std::unique_ptr<Channel>> channels;
  channels.push_back(
      std::make_unique<Channel>("world communicator", 0, -1, -1, comms[0], streams[0]));
  for (size_t i = 0; i < options.links.size(); ++i) {
    const NcclLink& link = options.links[i];
    channels.push_back(std::make_unique<Channel>(LinkName(link), link.link, link.peer,
                                                 options.rank < link.peer ? 1 : 0, comms[i + 1],
                                                 streams[i + 1]));
  }
  auto endpoint = std::make_shared<Endpoint>(options, std::move(channels),
                                             static_cast<int*>(barrier_buffer), pools != 0);
  endpoint->Start();
  return std::unique_ptr<Transport>(
      new adapter::EndpointTransport<Endpoint, Op>(NcclDescriptor(), std::move(endpoint)));
}

// INVALID_ARGUMENT when `links` or `link_shift` is unusable.
absl::Status ValidateLinks(const NcclOptions& options) {
  if (options.link_shift < 0 || options.link_shift >= 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("link_shift %d is not in [0, 64)", options.link_shift));
  }
  std::set<std::pair<uint64_t, int>> seen;
  for (size_t i = 0; i < options.links.size(); ++i) {
    const NcclLink& link = options.links[i];
    const std::string name = absl::StrFormat("links[%d] (%s)", i, LinkName(link));
    if (link.peer == options.rank) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": the peer is this rank"));
    }
    if (link.peer < 0 || link.peer >= options.world_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: the peer is not in [0, %d)", name, options.world_size));
    }
    if (options.link_shift > 0 && (link.link >> (64 - options.link_shift)) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: no tag has this link (tag >> %d); is it a tag?", name, options.link_shift));
    }
    if (!seen.insert({link.link, link.peer}).second) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": listed twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateNcclTransport(const NcclOptions& options,
                                                               RendezvousStore* store) {
  RETURN_IF_ERROR(ValidateConnectOptions("CreateNcclTransport", options, store));
  if (absl::Status links = ValidateLinks(options); !links.ok()) {
    return WithPrefix(links, absl::StrFormat("CreateNcclTransport: rank %d: ", options.rank));
  }
  absl::StatusOr<std::unique_ptr<Transport>> transport = Create(options, store);
  if (!transport.ok()) {
    return WithPrefix(transport.status(),
                      absl::StrFormat("rank %d (cuda:%d): ", options.rank, options.cuda_device));
  }
  return transport;
}

bool NcclBuilt() { return true; }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

bool NcclAvailable() { return CudaDeviceCount() > 0; }

}  // namespace stagecoach::transport
