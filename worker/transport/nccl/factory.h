// The NCCL data-plane backend: device memory, one NCCL communicator per transport and, when
// NcclOptions::links is set, one more per link (see Ordering below). Built when CMake finds the
// CUDA runtime and NCCL (STAGECOACH_HAVE_NCCL=1); otherwise CreateNcclTransport returns
// UNIMPLEMENTED and NcclAvailable() is false, so callers compile either way. This header needs
// no CUDA headers: streams are passed as void* (a cudaStream_t).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/transport/connect_options.h"
#include "worker/transport/rendezvous_store.h"
#include "worker/transport/transport.h"

namespace stagecoach::transport {

// A link (connect_options.h): a tag t belongs to link t >> NcclOptions::link_shift.
using NcclLink = Link;

// ConnectOptions and NCCL's own. world_size: NCCL refuses two ranks on one GPU. key_prefix
// defaults to "nccl/"; rank 0 publishes the NCCL unique id (hex) under
// key_prefix + "nccl_unique_id", and every transport, including a restarted attempt of the same
// job, needs a prefix of its own, e.g. "job/7/attempt/2/nccl/". connect_timeout bounds
// CreateNcclTransport as a whole: waiting for the unique ids, then for every rank to join the
// communicator and each peer to join its links' communicators.
struct NcclOptions : ConnectOptions {
  NcclOptions() { key_prefix = "nccl/"; }

  // The CUDA device (ordinal as this process sees it) the communicator, the buffers and
  // `compute_stream` belong to.
  int cuda_device = 0;

  // The stream that produces the data sent and consumes the data received (a cudaStream_t on
  // `cuda_device`); nullptr is the legacy default stream, which LibTorch uses by default.
  void* compute_stream = nullptr;

  // The links this rank transfers on. Empty: one communicator carries every transfer. Not
  // empty: each link gets a two-rank communicator, communication stream and queue of its own,
  // and a Send or Recv whose (tag >> link_shift, peer) is not listed is INVALID_ARGUMENT.
  // Every entry needs a peer in [0, world_size) other than this rank, and no (link, peer) may
  // appear twice. The lower rank of a link publishes its NCCL unique id under
  // key_prefix + "link/<link in hex, 0x...>/<lower rank>-<higher rank>".
  std::vector<NcclLink> links;

  // The link of a tag is tag >> link_shift; in [0, 64). Links must fit in 64 - link_shift bits.
  int link_shift = 28;
};

// Creates this rank's endpoint: rank 0 creates an ncclUniqueId and publishes it in `store`,
// the others read it, then every rank joins the communicator; then, with links, each pair of
// ranks creates the communicators of their links (all of a rank's at once, so the order in
// which ranks get there does not matter). Every rank of the job calls this with the same
// world_size and key_prefix, and with links that match its peers'; it returns once all have
// joined. `store` is used only during this call.
//
// Errors: INVALID_ARGUMENT (bad options or links, null store, a cuda_device that does not
// exist), FAILED_PRECONDITION (no CUDA device), DEADLINE_EXCEEDED (a unique id or a rank did
// not come within connect_timeout; for a link, the message names the link and peer), INTERNAL
// or UNAVAILABLE (a CUDA or NCCL call failed; the message names the call), UNIMPLEMENTED
// (built without NCCL).
//
// The transport, beyond transport.h (its capabilities are NcclDescriptor()'s):
//  - Buffers are device memory on cuda_device (or memory NCCL accepts). Send and Recv record
//    an event on compute_stream when posted, so a transfer moves what the compute stream had
//    produced by then; a Wait that returns OK makes compute_stream wait for the transfer, so
//    later work on that stream sees received data and may overwrite sent data.
//  - Ordering: NCCL has no tags, and one communicator runs its operations one after another.
//    Without links every transfer goes through the world communicator; with links each goes
//    through the communicator of its link (tag >> link_shift) and peer, and the world one
//    carries only Barrier. On one communicator, operations are issued in posting order on its
//    own stream: the k-th Send to q pairs with q's k-th Recv from this rank on it, whatever
//    the tags; an operation starts only once every earlier one on it has completed; and a send
//    larger than NCCL's internal buffering (a few MiB) completes only once the receiver has
//    reached the matching Recv. Different communicators never wait for each other. So both
//    sides must post one communicator's transfers in the same order (a link's: microbatch
//    order), and the posting orders must be free of cycles under these rules: without links
//    across all transfers between two ranks (1F1B's crossed SEND_F/RECV_B would deadlock; two
//    boundaries posted in different orders would silently swap equal-sized buffers), with
//    links only within each link.
//  - Byte counts: both sides must agree; NCCL cannot detect a mismatch between ranks
//    (behaviour is undefined). Zero-byte transfers complete when posted, without NCCL.
//  - Self-transfers: a one-rank transport (world_size 1) accepts peer 0, itself, as a
//    loopback for testing NCCL on one GPU. A self Send and Recv pair up by tag, in posting
//    order per tag, and are issued together as one NCCL group once both are posted (NCCL
//    needs both halves in one group); until then neither can complete. A byte-count mismatch
//    fails both (INTERNAL, "expected N bytes from rank 0 tag t, got M"). With more ranks,
//    peer == rank is INVALID_ARGUMENT as transport.h says.
//  - Waits poll CUDA events and ncclCommGetAsyncError of every communicator. A Wait that
//    timed out leaves the transfer posted; waiting again may complete it, but a transfer that
//    never pairs blocks every later one of its channel. An asynchronous NCCL error on any
//    communicator (e.g. a peer's network connection closed) aborts all of them and fails every
//    pending and later Wait with UNAVAILABLE (ncclRemoteError) or INTERNAL. A peer that dies
//    over NVLink/PCIe may go unnoticed: the Wait then times out.
//  - Barrier is a one-int ncclAllReduce on the world communicator's stream, so it also waits
//    for the transfers this rank posted before it on that channel (all of them without links,
//    none with links: Wait for those first). A timed-out Barrier stays posted and counts:
//    ranks pair their k-th Barrier calls.
//  - Abort calls ncclCommAbort on every communicator, which stops the kernels, so NCCL touches
//    no user buffer once it returned. Destroying the transport finalizes each communicator
//    whose transfers have all completed (flushing data of completed sends still in flight) and
//    aborts the others. Works may outlive the transport (Wait then returns CANCELLED).
//  - The communicators are nonblocking: no call blocks inside NCCL, and a background thread
//    hands queued operations to NCCL while the caller is busy elsewhere.
absl::StatusOr<std::unique_ptr<Transport>> CreateNcclTransport(const NcclOptions& options,
                                                               RendezvousStore* store);

// Whether this build includes the NCCL backend.
bool NcclBuilt();

// Number of CUDA devices this process sees; 0 when built without NCCL or when the CUDA runtime
// reports none or fails (no driver).
int CudaDeviceCount();

// NcclBuilt() and at least one CUDA device.
bool NcclAvailable();

}  // namespace stagecoach::transport
