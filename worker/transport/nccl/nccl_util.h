// Code the NCCL backends share: the transport (nccl_transport.cc) and the collectives
// (worker/collectives/nccl/). CUDA and NCCL errors as Status, the current device for a scope,
// and the life of a nonblocking communicator: its unique id through the rendezvous store,
// joining it, polling it, tearing it down. For those backends only (it needs the CUDA runtime
// and NCCL headers); callers include a backend's factory.h.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/transport/connect_options.h"
#include "worker/transport/rendezvous_store.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "The NCCL backends need NCCL 2.14 or newer (nonblocking communicators, ncclCommFinalize)."
#endif

namespace stagecoach::transport {

// INTERNAL "<call> failed: <CUDA error name> (<description>)".
absl::Status CudaError(absl::string_view call, cudaError_t error);

// "<call> failed: <NCCL's message> (ncclResult_t N)[: <ncclGetLastError(comm)>]"; UNAVAILABLE
// for ncclRemoteError (a peer or the network failed), else INTERNAL. `comm` may be null.
absl::Status NcclError(absl::string_view call, ncclResult_t result, ncclComm_t comm);

// `status` with `prefix` before its message.
absl::Status WithPrefix(const absl::Status& status, absl::string_view prefix);

// Makes `device` current for the scope and restores the previous device. status() is the
// cudaGetDevice or cudaSetDevice error, if any.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool restore_ = false;
  absl::Status status_;
};

// FAILED_PRECONDITION ("no CUDA device: ...") when this process sees no CUDA device;
// INVALID_ARGUMENT when `cuda_device` is not one of them.
absl::Status CheckCudaDevice(int cuda_device);

// An ncclUniqueId as lowercase hex, and back (nullopt unless exactly that many hex digits).
std::string EncodeId(const ncclUniqueId& id);
std::optional<ncclUniqueId> DecodeId(absl::string_view hex);

// Creates a unique id and publishes it (hex) under `key`.
absl::StatusOr<ncclUniqueId> PublishUniqueId(RendezvousStore* store, const std::string& key);
// The unique id rank `owner` published under `key`, waiting up to `timeout` for it;
// INVALID_ARGUMENT when the value is not one.
absl::StatusOr<ncclUniqueId> ReadUniqueId(RendezvousStore* store, const std::string& key, int owner,
                                          absl::Duration timeout);

// One poll of a nonblocking communicator (ncclCommGetAsyncError): true when it is ready for the
// next call (ncclSuccess), false while NCCL is still carrying out the last one
// (ncclInProgress); else the asynchronous error, as NcclError(`what`, ...), or the error of
// ncclCommGetAsyncError itself.
absl::StatusOr<bool> CommReady(ncclComm_t comm, absl::string_view what);

// Joins the nonblocking communicator of options.world_size ranks: rank 0 publishes a unique id
// under options.key_prefix + "nccl_unique_id", the others wait up to options.connect_timeout
// for it, then every rank initializes its communicator and waits until `deadline` for all to
// have joined (DEADLINE_EXCEEDED). The current device must be the communicator's. On error
// nothing is left to clean up.
absl::StatusOr<ncclComm_t> JoinCommunicator(const ConnectOptions& options, RendezvousStore* store,
                                            absl::Time deadline);

// Finalizes every communicator of `comms` at once (flushing, on NCCL's threads, sends still in
// flight), destroys those that finalized within `timeout` and aborts the others. Each must be
// idle: no operation of it may be pending.
void FinalizeAndDestroy(const std::vector<ncclComm_t>& comms, absl::Duration timeout);

}  // namespace stagecoach::transport
