// The data-plane transport: point-to-point transfers of raw buffers between the ranks of one
// job. Backends: Gloo (host memory, TCP; gloo/factory.h) and, where CUDA and NCCL are found,
// NCCL (device memory). Callers include this header and one backend's factory.h only, or create
// a transport by backend name through registry.h. What a backend does beyond this interface is
// a capability (common/transport/backends.h), asked with capabilities(), never told by name.
//
// Matching: a Send(data, n, peer=q, tag=t) on rank p pairs with the Recv(buf, n, peer=p, tag=t)
// on rank q. Transfers with the same (peer, tag) pair up in the order they were posted. Both
// sides must agree on the byte count; a mismatch is an error on the receiver, never a silent
// truncation. The one exception is asked for by name: RecvUpTo takes a send of at most its
// bytes (backends with BackendCapabilities::shorter_receives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/transport/backends.h"

namespace stagecoach::transport {

// Bytes moved by one transport since it was created.
struct TransferStats {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

// A posted send or receive. Not thread-safe; owned by the caller that posted it.
class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the transfer completed (OK), `timeout` passed (DEADLINE_EXCEEDED), the
  // transport failed (UNAVAILABLE or INTERNAL, with the backend's message: a peer closed its
  // connection, a size mismatch, ...), or the transport was aborted (CANCELLED).
  // Calling Wait again after it returned OK returns OK at once.
  virtual absl::Status Wait(absl::Duration timeout) = 0;

  // Whether the transfer has finished, without blocking: true once Wait would return at once
  // (the transfer completed or failed, or the transport was aborted or destroyed). Every
  // backend finishes a send without its caller waiting, so a caller may poll its sends and
  // release their buffers as soon as they are done, rather than waiting for all of them at
  // the end; a receive may be seen finished only by Wait (Gloo). Wait still reports the result.
  virtual bool Done() = 0;
};

// One rank's endpoint of a job's data plane. Send, Recv and Barrier are called from one thread
// at a time; Abort and stats may be called from any thread.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The backend's registered name (BackendDescriptor::name), for messages and metrics.
  virtual absl::string_view backend() const = 0;
  // What the backend does beyond this interface, e.g. whether it takes device memory.
  virtual const BackendCapabilities& capabilities() const = 0;

  // Starts sending `bytes` bytes at `data` to rank `peer`. `data` must stay valid and unchanged
  // until the returned Work's Wait returned OK, or the transport was aborted or destroyed.
  // INVALID_ARGUMENT for a bad peer (out of range or this rank).
  virtual absl::StatusOr<std::unique_ptr<Work>> Send(const void* data, size_t bytes, int peer,
                                                     uint64_t tag) = 0;

  // Starts receiving exactly `bytes` bytes from rank `peer` into `data`, which must stay valid
  // until Wait returned OK, or the transport was aborted or destroyed.
  virtual absl::StatusOr<std::unique_ptr<Work>> Recv(void* data, size_t bytes, int peer,
                                                     uint64_t tag) = 0;

  // Starts receiving a send of at most `max_bytes` bytes from rank `peer` into `data` (as Recv
  // otherwise): for a value whose size the receiver does not know when it posts the receive,
  // so that the value travels as soon as it is sent. How many bytes arrived the caller learns
  // from the message itself (the pipeline's ragged activations start with a shape header); a
  // send of more fails both sides. Stats count such a receive's `max_bytes`. UNIMPLEMENTED on a backend
  // without BackendCapabilities::shorter_receives.
  virtual absl::StatusOr<std::unique_ptr<Work>> RecvUpTo(void* data, size_t max_bytes, int peer,
                                                         uint64_t tag) {
    (void)data, (void)max_bytes, (void)peer, (void)tag;
    return absl::UnimplementedError(
        absl::StrCat("the ", backend(), " transport cannot receive fewer bytes than posted"));
  }

  // Returns once every rank has entered Barrier, or an error after `timeout`.
  virtual absl::Status Barrier(absl::Duration timeout) = 0;

  // Makes every pending and later Wait and Barrier return CANCELLED promptly, e.g. when the job
  // is stopped or a peer is known to be lost. Idempotent. After Abort the transport can only be
  // destroyed; destruction then does not wait for peers.
  virtual void Abort() = 0;

  virtual TransferStats stats() const = 0;
};

}  // namespace stagecoach::transport
