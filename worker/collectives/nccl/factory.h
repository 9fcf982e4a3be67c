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
// The collectives, beyond collectives.h:
//  - Ordering: each call is enqueued on the group's own stream after an event recorded on
//    compute_stream (so it reduces what compute had produced by then), then waited for by
//    polling an event and ncclCommGetAsyncError until the call's timeout; when it returns OK,
//    compute_stream is made to wait for it. compute_stream must belong to cuda_device. A zero
//    count returns OK without NCCL.
//  - kMean is ncclAvg, which for floating types multiplies each contribution by 1/n before
//    summing: it may differ from the sum divided by n in the last bits; every rank still gets
//    the same bits.
//  - Errors: a timeout (DEADLINE_EXCEEDED; NCCL does not say which rank it waits for) or a CUDA
//    or NCCL error (INTERNAL, or UNAVAILABLE for ncclRemoteError) aborts the communicator
//    (ncclCommAbort), so NCCL touches no buffer after the call returned; later calls return
//    FAILED_PRECONDITION. Abort aborts the communicator too; later calls return CANCELLED.
//  - Byte counts, counted when a call returns OK, are those of NCCL's ring algorithms, as NCCL
//    does not report what it moved. With n = size() and N the bytes of the whole buffer (the
//    buffer for all-reduce and broadcast, size() * count elements for reduce-scatter and
//    all-gather), each rank sends and receives 2(n-1)/n N for all-reduce, (n-1)/n N for
//    reduce-scatter and all-gather; for broadcast the root sends N and every other rank
//    receives N (what a rank forwards along NCCL's chain is not counted). A group of one moves
//    nothing.
//  - Destroying the collectives (not during a call) finalizes and destroys the communicator,
//    or aborts it if it was not intact or does not finalize within a few seconds.
absl::StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(
    const NcclCollectivesOptions& options, transport::RendezvousStore* store);

}  // namespace stagecoach::collectives
