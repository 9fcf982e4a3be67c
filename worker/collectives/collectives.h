// Collectives over a data-parallel group: the D ranks that hold the same pipeline rank in each
// of a job's D replicas (placement.replicas). They reduce the replicas' gradients (all-reduce,
// or reduce-scatter then all-gather with a sharded optimizer) and spread parameters.
//
// Backends (each with a factory.h): ring collectives written on a Transport (ring/factory.h:
// host memory; the CPU backend, over a Gloo transport of the group), and NCCL's own collectives
// (nccl/factory.h: device memory, one communicator per group). Callers include this header and
// one backend's factory.h, or create one by transport backend name through
// worker/collectives/registry.h.
//
// Buffers hold `count` elements of `dtype`, in the backend's memory (takes_device_memory()).
// Every rank of the group makes the same calls in the same order with the same counts, types,
// operations and root; a call returns when this rank's part is done (its output is complete
// and its input may be reused). Calls are made from one thread at a time; Abort and stats from
// any thread.
//
// Errors: INVALID_ARGUMENT (a negative count, a root outside the group, a null buffer with a
// positive count) before anything is sent; DEADLINE_EXCEEDED when the call did not finish
// within its timeout (naming the operation and the peer it waited for); CANCELLED after Abort;
// UNAVAILABLE or INTERNAL with the backend's message when a peer is lost or a transfer fails.
// After any error but INVALID_ARGUMENT the group is unusable: the caller aborts it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace stagecoach::collectives {

enum class DataType { kFloat32, kFloat64 };

// Bytes of one element.
size_t ElementBytes(DataType dtype);
absl::string_view DataTypeName(DataType dtype);

// How contributions combine. kMean is the sum divided by the group's size, computed once per
// element and then copied, so every rank gets the same bits.
enum class ReduceOp { kSum, kMean, kMax };

absl::string_view ReduceOpName(ReduceOp op);

// Payload bytes this rank moved since the group was created.
struct CollectiveStats {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

class Collectives {
 public:
  virtual ~Collectives() = default;

  // This rank's index in the group, and the group's size (>= 1).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The backend's name ("ring over gloo", "nccl"), for messages and metrics.
  virtual absl::string_view backend() const = 0;
  // Buffers are device memory on the worker's CUDA device (NCCL); else host memory.
  virtual bool takes_device_memory() const = 0;

  // In place: `data` holds `count` elements on every rank; afterwards each rank holds their
  // reduction.
  virtual absl::Status AllReduce(void* data, int64_t count, DataType dtype, ReduceOp op,
                                 absl::Duration timeout) = 0;

  // `input` holds size() * `count` elements (block i = elements [i*count, (i+1)*count)); rank i
  // gets the reduction of every rank's block i in `output` (`count` elements). `input` and
  // `output` do not overlap.
  virtual absl::Status ReduceScatter(const void* input, void* output, int64_t count, DataType dtype,
                                     ReduceOp op, absl::Duration timeout) = 0;

  // Every rank contributes `count` elements; `output` (size() * `count` elements) gets rank i's
  // in block i, on every rank. `input` may be the rank's own block of `output`.
  virtual absl::Status AllGather(const void* input, void* output, int64_t count, DataType dtype,
                                 absl::Duration timeout) = 0;

  // `data` of rank `root` is copied into `data` of every other rank.
  virtual absl::Status Broadcast(void* data, int64_t count, DataType dtype, int root,
                                 absl::Duration timeout) = 0;

  // Makes the call in progress and every later one return CANCELLED promptly, on this rank;
  // peers waiting for this rank then fail too. Idempotent.
  virtual void Abort() = 0;

  virtual CollectiveStats stats() const = 0;
};

// The checks every backend makes before a call (INVALID_ARGUMENT naming `what`, e.g.
// "all-reduce"): count >= 0, buffers non-null when count > 0, root in [0, size) when root >= 0
// is given (pass -1 for calls without a root).
absl::Status CheckCall(absl::string_view what, int64_t count, const void* a, const void* b,
                       int root, int size);

}  // namespace stagecoach::collectives
