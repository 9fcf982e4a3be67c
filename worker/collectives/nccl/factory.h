// NCCL's own collectives for a data-parallel group: device memory, one communicator per group.
// Built when the worker's NCCL transport is (STAGECOACH_HAVE_NCCL=1); otherwise
// CreateNcclCollectives returns UNIMPLEMENTED, so callers compile either way. No CUDA headers
// here: streams are void* (a cudaStream_t).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/collectives/collectives.h"
#include "worker/transport/connect_options.h"
#include "worker/transport/rendezvous_store.h"

namespace stagecoach::collectives {

// rank/world_size: this rank's place in the group. key_prefix: rank 0 publishes the group's
// NCCL unique id (hex) under key_prefix + "nccl_unique_id"; every group, and every attempt of a
// job, needs its own prefix (the worker uses "<attempt prefix>dp/<pipeline rank>/").
// connect_timeout bounds the wait for the id and for every rank to join.
struct NcclCollectivesOptions : transport::ConnectOptions {
  // The CUDA device (ordinal as this process sees it) of the communicator and the buffers.
  int cuda_device = 0;
  // The stream that produces the buffers' contents and consumes the results; nullptr is the
  // legacy default stream (LibTorch's default).
  void* compute_stream = nullptr;
};

// Creates the group's communicator (nonblocking; rank 0 makes the unique id). Every rank of
// the group calls it with the same world_size and key_prefix. Errors: as CreateNcclTransport's
// (INVALID_ARGUMENT, FAILED_PRECONDITION without a device, DEADLINE_EXCEEDED, INTERNAL or
// UNAVAILABLE naming the CUDA or NCCL call, UNIMPLEMENTED without NCCL).
//
// The collectives, beyond collectives.h: each call is enqueued on the group's own stream after
// an event recorded on compute_stream (so it reduces what compute had produced by then), then
// waited for by polling an event and ncclCommGetAsyncError until the call's timeout; when it
// returns OK, compute_stream is made to wait for it. kMean is ncclAvg. A timeout or an
// asynchronous NCCL error aborts the communicator (ncclCommAbort), so NCCL touches no buffer
// after the call returned. Byte counts follow NCCL's ring algorithms (all-reduce 2(n-1)/n N,
// reduce-scatter and all-gather (n-1)/n of the whole buffer, broadcast N), as NCCL does not
// report what it moved.
absl::StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(
    const NcclCollectivesOptions& options, transport::RendezvousStore* store);

}  // namespace stagecoach::collectives
