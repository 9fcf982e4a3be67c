// The Gloo data-plane backend: host memory over TCP, one connection per pair of ranks.
// Callers include this header and transport.h only.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/transport/connect_options.h"
#include "worker/transport/rendezvous_store.h"
#include "worker/transport/transport.h"

namespace stagecoach::transport {

// ConnectOptions (rank, world_size, key_prefix, connect_timeout) and Gloo's own. key_prefix
// defaults to "gloo/", e.g. "job/7/attempt/2/gloo/" for an attempt of a job. connect_timeout
// bounds the wait, in total, for the other ranks to appear in the store; opening the TCP
// connection to a rank whose address has arrived is bounded separately by the same amount, so
// a call returns within about twice this at worst.
struct GlooOptions : ConnectOptions {
  GlooOptions() { key_prefix = "gloo/"; }

  // Address or host name of the local interface to bind. It is also the address this rank
  // advertises, so every other rank must be able to reach it. Each connection listens on its
  // own ephemeral port. The default only works when all ranks run on one machine.
  std::string hostname = "127.0.0.1";
};

// Creates this rank's endpoint of the job's data plane: publishes this rank's addresses in
// `store`, reads every other rank's and connects to all of them. Every rank of the job calls
// this with the same world_size and key_prefix. Blocks until connected to all other ranks.
// `store` is used only during this call.
//
// Errors: INVALID_ARGUMENT (bad options, null store, an address that cannot be bound),
// DEADLINE_EXCEEDED (a rank did not publish its address in time; names the missing keys),
// UNAVAILABLE (a connection failed), or an error the store returned.
//
// The transport, beyond transport.h (its capabilities are GlooDescriptor()'s): every uint64
// tag is valid. A Wait that timed out leaves the transfer posted, and waiting again may still
// complete it. A size mismatch fails the receive (INTERNAL, "expected N bytes from rank p tag
// t, got M") and its send, and writes nothing into the receive buffer. A peer's death or Abort
// fails waits on that peer with UNAVAILABLE within milliseconds; Abort resets this rank's
// connections, so peers see it the same way. Works may outlive the transport (Wait then returns
// CANCELLED). Destroying a transport whose Works all completed closes its connections gracefully:
// data of completed sends still arrives. A send completes without a Wait (Work::Done) once its
// data is written to the socket; a receive completes in Wait. It holds a TCP connection and two
// threads per other rank (control messages, send completion), and one more thread.
absl::StatusOr<std::unique_ptr<Transport>> CreateGlooTransport(const GlooOptions& options,
                                                               RendezvousStore* store);

}  // namespace stagecoach::transport
