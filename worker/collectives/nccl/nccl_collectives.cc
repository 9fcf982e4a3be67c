// NCCL's collectives for a data-parallel group (factory.h): CUDA runtime API and NCCL C API
// only, no LibTorch.
//
// One communicator per group, nonblocking (ncclConfig_t::blocking = 0: a blocking one may block
// the calling thread inside NCCL without a bound, see worker/transport/nccl/nccl_transport.cc),
// with a communication stream and two events (`ready`, `done`) of its own. A call, under mu_
// except while it sleeps:
//   1. records `ready` on the compute stream and makes the comm stream wait for it;
//   2. enqueues the NCCL collective on the comm stream. NCCL may answer ncclInProgress: it is
//      still issuing the collective on its own threads (e.g. connecting the ranks on the first
//      call), and no other NCCL call or CUDA work on the stream may come before
//      ncclCommGetAsyncError reports ncclSuccess;
//   3. polls (10 us to 1 ms backoff) ncclCommGetAsyncError until it reports ncclSuccess, then
//      records `done` on the comm stream, then polls cudaEventQuery(done) and
//      ncclCommGetAsyncError until `done` completes or the call's deadline passes;
//   4. makes the compute stream wait for `done` and counts the call's bytes.
// The events are reused: calls come one at a time, and a call's waits on them are enqueued
// before the next call records them again.
//
// Failure and Abort. A timeout or a CUDA or NCCL error aborts the communicator (ncclCommAbort
// stops NCCL's kernels, so no buffer is touched after the call returned) and marks the group
// failed: later calls return FAILED_PRECONDITION, as the ring's do. Abort takes mu_, so
// ncclCommAbort never runs during another NCCL call on the communicator, and a call polling
// sees aborted_ within a poll interval; since `done` also completes for an aborted kernel, a
// call trusts `done` only while aborted_ is unset. The destructor finalizes an intact
// communicator (all its calls have completed) and destroys it, else it has been aborted.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/util/status_macros.h"
#include "worker/collectives/nccl/factory.h"
#include "worker/transport/nccl/nccl_util.h"

namespace stagecoach::collectives {
namespace {

using transport::CommReady;
using transport::CudaError;
using transport::DeviceGuard;
using transport::NcclError;
using transport::WithPrefix;

constexpr absl::Duration kPollMin = absl::Microseconds(10);
constexpr absl::Duration kPollMax = absl::Milliseconds(1);
// How long the destructor lets ncclCommFinalize flush before it aborts instead.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(5);

ncclDataType_t NcclType(DataType dtype) {
  return dtype == DataType::kFloat64 ? ncclFloat64 : ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMean:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

int64_t Bytes(int64_t count, DataType dtype) {
  return count * static_cast<int64_t>(ElementBytes(dtype));
}

// Enqueues one NCCL collective on the communicator and stream.
using Enqueue = absl::FunctionRef<ncclResult_t(ncclComm_t, cudaStream_t)>;

struct Call {
  const char* what;  // "all-reduce"
  const char* nccl;  // "ncclAllReduce"
  int64_t count;     // Elements; 0 skips NCCL.
  DataType dtype;
  int64_t bytes_sent;  // Counted when the call completes (factory.h's formulas).
  int64_t bytes_received;
  absl::Duration timeout;
};

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(const NcclCollectivesOptions& options, ncclComm_t comm, cudaStream_t stream,
                  cudaEvent_t ready, cudaEvent_t done)
      : rank_(options.rank),
        size_(options.world_size),
        device_(options.cuda_device),
        compute_stream_(options.compute_stream == nullptr
                            ? cudaStreamLegacy
                            : static_cast<cudaStream_t>(options.compute_stream)),
        stream_(stream),
        ready_(ready),
        done_(done),
        comm_(comm) {}

  ~NcclCollectives() override {
    DeviceGuard guard(device_);
    absl::MutexLock lock(&mu_);
    if (comm_ != nullptr) transport::FinalizeAndDestroy({comm_}, kFinalizeTimeout);
    comm_ = nullptr;
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);  // Returns at once; CUDA releases it when its work is done.
  }

  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view backend() const override { return "nccl"; }
  bool takes_device_memory() const override { return true; }

  absl::Status AllReduce(void* data, int64_t count, DataType dtype, ReduceOp op,
                         absl::Duration timeout) override {
    RETURN_IF_ERROR(CheckCall("all-reduce", count, data, data, -1, size_));
    const int64_t moved = 2 * (size_ - 1) * Bytes(count, dtype) / size_;
    return Run(Call{"all-reduce", "ncclAllReduce", count, dtype, moved, moved, timeout},
               [&](ncclComm_t comm, cudaStream_t stream) {
                 return ncclAllReduce(data, data, static_cast<size_t>(count), NcclType(dtype),
                                      NcclOp(op), comm, stream);
               });
  }

  absl::Status ReduceScatter(const void* input, void* output, int64_t count, DataType dtype,
                             ReduceOp op, absl::Duration timeout) override {
    RETURN_IF_ERROR(CheckCall("reduce-scatter", count, input, output, -1, size_));
    const int64_t moved = (size_ - 1) * Bytes(count, dtype);
    return Run(Call{"reduce-scatter", "ncclReduceScatter", count, dtype, moved, moved, timeout},
               [&](ncclComm_t comm, cudaStream_t stream) {
                 return ncclReduceScatter(input, output, static_cast<size_t>(count),
                                          NcclType(dtype), NcclOp(op), comm, stream);
               });
  }

  absl::Status AllGather(const void* input, void* output, int64_t count, DataType dtype,
                         absl::Duration timeout) override {
    RETURN_IF_ERROR(CheckCall("all-gather", count, input, output, -1, size_));
    const int64_t moved = (size_ - 1) * Bytes(count, dtype);
    // In place when `input` is this rank's block of `output`, as NCCL defines it.
    return Run(Call{"all-gather", "ncclAllGather", count, dtype, moved, moved, timeout},
               [&](ncclComm_t comm, cudaStream_t stream) {
                 return ncclAllGather(input, output, static_cast<size_t>(count), NcclType(dtype),
                                      comm, stream);
               });
  }

  absl::Status Broadcast(void* data, int64_t count, DataType dtype, int root,
                         absl::Duration timeout) override {
    RETURN_IF_ERROR(CheckCall("broadcast", count, data, data, root, size_));
    const int64_t bytes = size_ > 1 ? Bytes(count, dtype) : 0;
    return Run(Call{"broadcast", "ncclBroadcast", count, dtype, rank_ == root ? bytes : 0,
                    rank_ == root ? 0 : bytes, timeout},
               [&](ncclComm_t comm, cudaStream_t stream) {
                 return ncclBroadcast(data, data, static_cast<size_t>(count), NcclType(dtype), root,
                                      comm, stream);
               });
  }

  void Abort() override {
    DeviceGuard guard(device_);
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    AbortCommLocked();
  }

  CollectiveStats stats() const override {
    return CollectiveStats{bytes_sent_.load(), bytes_received_.load()};
  }

 private:
  // "all-reduce (rank 1 of 2): "
  std::string Prefix(const Call& call) const {
    return absl::StrFormat("%s (rank %d of %d): ", call.what, rank_, size_);
  }

  absl::Status Run(const Call& call, Enqueue enqueue);
  // Steps 1 and 2 (see the top of this file).
  absl::Status StartLocked(const Call& call, Enqueue enqueue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One poll of step 3: true once `done` completed and the compute stream waits for it.
  // `issued`: whether `done` has been recorded.
  absl::StatusOr<bool> PollLocked(const Call& call, bool* issued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UsableLocked(const Call& call) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DEADLINE_EXCEEDED for a call that did not complete in time.
  static absl::Status TimedOut(const Call& call, bool issued);
  // Marks the group failed and aborts the communicator; `status` with the call's prefix.
  absl::Status FailLocked(const Call& call, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  const int rank_;
  const int size_;
  const int device_;
  const cudaStream_t compute_stream_;
  const cudaStream_t stream_;  // The communication stream (non-blocking).
  const cudaEvent_t ready_;    // Recorded on compute_stream_ when a call starts.
  const cudaEvent_t done_;     // Recorded on stream_ after the call's collective.

  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};

  mutable absl::Mutex mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_);  // Null once aborted or destroyed.
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status NcclCollectives::Run(const Call& call, Enqueue enqueue) {
  const absl::Time deadline = absl::Now() + call.timeout;
  DeviceGuard guard(device_);
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(UsableLocked(call));
    if (call.count == 0) return absl::OkStatus();  // Every rank has the same count.
    if (!guard.status().ok()) return FailLocked(call, guard.status());
    RETURN_IF_ERROR(StartLocked(call, enqueue));
  }
  bool issued = false;
  absl::Duration pause = kPollMin;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<bool> complete = PollLocked(call, &issued);
      if (!complete.ok()) return complete.status();
      if (*complete) break;
      const absl::Time now = absl::Now();
      if (now >= deadline) return FailLocked(call, TimedOut(call, issued));
      pause = std::min(pause, deadline - now);
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, kPollMax);
  }
  bytes_sent_ += call.bytes_sent;
  bytes_received_ += call.bytes_received;
  return absl::OkStatus();
}

absl::Status NcclCollectives::StartLocked(const Call& call, Enqueue enqueue) {
  cudaError_t error = cudaEventRecord(ready_, compute_stream_);
  if (error != cudaSuccess) {
    return FailLocked(call, CudaError("cudaEventRecord on the compute stream", error));
  }
  error = cudaStreamWaitEvent(stream_, ready_, 0);
  if (error != cudaSuccess) {
    return FailLocked(call, CudaError("cudaStreamWaitEvent on the communication stream", error));
  }
  const ncclResult_t result = enqueue(comm_, stream_);
  if (result != ncclSuccess && result != ncclInProgress) {
    return FailLocked(call, NcclError(call.nccl, result, comm_));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> NcclCollectives::PollLocked(const Call& call, bool* issued) {
  RETURN_IF_ERROR(UsableLocked(call));  // Abort from another thread.
  absl::StatusOr<bool> ready = CommReady(comm_, absl::StrCat(call.nccl, " (asynchronous)"));
  if (!ready.ok()) return FailLocked(call, ready.status());
  if (!*ready) return false;  // NCCL is still issuing the collective.
  if (!*issued) {
    const cudaError_t recorded = cudaEventRecord(done_, stream_);
    if (recorded != cudaSuccess) {
      return FailLocked(call, CudaError("cudaEventRecord on the communication stream", recorded));
    }
    *issued = true;
  }
  const cudaError_t queried = cudaEventQuery(done_);
  if (queried == cudaErrorNotReady) return false;
  if (queried != cudaSuccess) return FailLocked(call, CudaError("cudaEventQuery", queried));
  const cudaError_t waited = cudaStreamWaitEvent(compute_stream_, done_, 0);
  if (waited != cudaSuccess) {
    return FailLocked(call, CudaError("cudaStreamWaitEvent on the compute stream", waited));
  }
  return true;
}

absl::Status NcclCollectives::UsableLocked(const Call& call) const {
  if (aborted_) {
    return absl::CancelledError(absl::StrCat(Prefix(call), "the collectives were aborted"));
  }
  if (failed_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(call), "an earlier collective failed on this group"));
  }
  return absl::OkStatus();
}

absl::Status NcclCollectives::TimedOut(const Call& call, bool issued) {
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s of %d x %s timed out after %s: %s (NCCL does not say which rank it waits for); the "
      "communicator was aborted",
      call.nccl, call.count, DataTypeName(call.dtype), absl::FormatDuration(call.timeout),
      issued ? "not every rank of the group has made this call, or a rank is lost"
             : "NCCL is still issuing it (connecting the group's ranks)"));
}

absl::Status NcclCollectives::FailLocked(const Call& call, const absl::Status& status) {
  failed_ = true;
  AbortCommLocked();
  return WithPrefix(status, Prefix(call));
}

absl::StatusOr<std::unique_ptr<Collectives>> Create(const NcclCollectivesOptions& options,
                                                    transport::RendezvousStore* store) {
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  RETURN_IF_ERROR(transport::CheckCudaDevice(options.cuda_device));
  DeviceGuard guard(options.cuda_device);
  RETURN_IF_ERROR(guard.status());
  ASSIGN_OR_RETURN(ncclComm_t comm, transport::JoinCommunicator(options, store, deadline));
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
  const char* failed = "cudaStreamCreateWithFlags";
  cudaError_t error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (error == cudaSuccess) {
    failed = "cudaEventCreateWithFlags";
    error = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  }
  if (error == cudaSuccess) error = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (error != cudaSuccess) {
    ncclCommAbort(comm);
    if (ready != nullptr) cudaEventDestroy(ready);
    if (stream != nullptr) cudaStreamDestroy(stream);
    return CudaError(failed, error);
  }
  return std::unique_ptr<Collectives>(new NcclCollectives(options, comm, stream, ready, done));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(
    const NcclCollectivesOptions& options, transport::RendezvousStore* store) {
  RETURN_IF_ERROR(transport::ValidateConnectOptions("CreateNcclCollectives", options, store));
  absl::StatusOr<std::unique_ptr<Collectives>> made = Create(options, store);
  if (!made.ok()) {
    return WithPrefix(made.status(),
                      absl::StrFormat("CreateNcclCollectives: rank %d of %d (cuda:%d): ",
                                      options.rank, options.world_size, options.cuda_device));
  }
  return made;
}

}  // namespace stagecoach::collectives
