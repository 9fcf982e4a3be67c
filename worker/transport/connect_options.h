// What every backend's factory needs to connect one rank of a job. GlooOptions and NcclOptions
// (gloo/factory.h, nccl/factory.h) extend ConnectOptions; the registry of factories
// (registry.h) hands each backend a ConnectRequest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/transport/rendezvous_store.h"

namespace stagecoach::transport {

struct ConnectOptions {
  // This process's rank, in [0, world_size).
  int rank = 0;

  // Number of ranks in the job, >= 1.
  int world_size = 1;

  // Prefix of the keys the rendezvous writes to the store. Transports created over the same
  // store at the same time, or one after another for the same ranks (a restarted attempt),
  // each need their own prefix, e.g. "job/7/attempt/2/gloo/". Each backend's options set a
  // default of their own.
  std::string key_prefix;

  // Bounds the rendezvous and the connections; each backend's factory says how exactly.
  absl::Duration connect_timeout = absl::Seconds(30);
};

// A link: one kind of message over one stage boundary, exchanged with one peer rank. A tag t
// belongs to link t >> link_shift. Both ranks of a link list it with the same number, each
// naming the other as peer (the runtime's LinksOfRank gives a rank's links). Backends whose
// transfers are ordered per link (BackendCapabilities::matches_tags false) use them.
struct Link {
  uint64_t link = 0;
  int peer = 0;
};

// INVALID_ARGUMENT naming `creator` ("CreateGlooTransport") for a null store, a rank outside
// [0, world_size) or a connect_timeout that is not positive; else OK.
absl::Status ValidateConnectOptions(absl::string_view creator, const ConnectOptions& options,
                                    const RendezvousStore* store);

}  // namespace stagecoach::transport
