// Ring collectives on a Transport: the CPU backend of collectives.h, for host memory.
//
// Why our own rings rather than Gloo's collectives: Debian's Gloo offers allreduce, allgather and
// broadcast but reduce-scatter only through its legacy algorithm classes, and a timeout there
// closes the whole Gloo context; written on our Transport, every wait is bounded by the call's
// timeout and cut short by Abort, and every byte is counted by the transport, like the
// pipeline's own transfers.
//
// Algorithms (n = size(), N = the bytes of the whole buffer):
//   AllReduce      ring reduce-scatter then ring all-gather over n nearly equal chunks (sizes
//                  differ by at most one element): each rank sends and receives 2(n-1)/n N.
//                  Each chunk is reduced (and for kMean divided by n) on one rank and copied to
//                  the others, so every rank ends with the same bits.
//   ReduceScatter  the ring reduce-scatter: each rank sends (n-1)/n of its input.
//   AllGather      the ring all-gather: each rank sends (n-1) times its block.
//   Broadcast      the root sends the buffer to each other rank: (n-1) N from the root.
// Sums are taken in ring order, so a chunk's sum may round differently from a left-to-right
// sum over ranks (by at most the float rounding of n-1 additions).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/collectives/collectives.h"
#include "worker/transport/transport.h"

namespace stagecoach::collectives {

// The group is the transport's world (rank and size are the transport's). Takes the transport,
// which must be host memory (INVALID_ARGUMENT otherwise) and is used by these collectives
// alone: nothing else may post transfers on it. Abort aborts the transport.
absl::StatusOr<std::unique_ptr<Collectives>> CreateRingCollectives(
    std::unique_ptr<transport::Transport> transport);

}  // namespace stagecoach::collectives
