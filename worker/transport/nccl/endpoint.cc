// Endpoint (endpoint.h): routing, posting and launching transfers on their channels.
#include "worker/transport/nccl/endpoint.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/transport/adapter.h"
#include "worker/transport/nccl/nccl_util.h"

namespace stagecoach::transport::nccl_internal {

using adapter::Hex;

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

}  // namespace stagecoach::transport::nccl_internal
