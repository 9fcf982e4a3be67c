// Internal to the NCCL backend (nccl_transport.cc, endpoint.cc, endpoint_wait.cc): the Endpoint
// that carries an NCCL transport's transfers, its channels and its ops. CUDA runtime API and
// NCCL C API only, no LibTorch.
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
// compute_stream waits for the event (cudaStreamWaitEvent) and the op counts in the stats.
// Done polls the same way once, without sleeping, so any op completes without a Wait. An
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
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
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
#include "worker/transport/nccl/factory.h"
#include "worker/transport/nccl/nccl_util.h"

namespace stagecoach::transport::nccl_internal {

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
  kDone,       // A Wait or Done saw it complete.
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

inline int Channel::PeerInComm(const Op& op) const {
  return peer_in_comm >= 0 ? peer_in_comm : op.peer;
}

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
  // Whether a Wait on `op` would return at once; one poll, never sleeps.
  bool Done(Op& op);
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

}  // namespace stagecoach::transport::nccl_internal
