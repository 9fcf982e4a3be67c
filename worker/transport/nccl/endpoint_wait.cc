// Endpoint (endpoint.h): polling and waiting for ops, errors, Barrier, Abort, the pump thread and
// teardown.
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
#include "worker/transport/nccl/endpoint.h"
#include "worker/transport/nccl/nccl_util.h"

namespace stagecoach::transport::nccl_internal {

using adapter::Hex;

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

bool Endpoint::Done(Op& op) {
  DeviceGuard guard(device_);
  absl::MutexLock lock(&mu_);
  if (!guard.status().ok()) return FinalStatusLocked(op).has_value();
  return PollLocked(op).has_value();
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

}  // namespace stagecoach::transport::nccl_internal
