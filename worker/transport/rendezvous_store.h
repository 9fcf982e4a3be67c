// A key-value store through which the ranks of a job find each other before the data plane
// exists (Gloo addresses, NCCL unique ids). In production it is the coordinator's rendezvous
// store reached over gRPC (worker/service/coordinator_store.h); tests use InMemoryStore.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stagecoach::transport {

// Thread-safe. Keys are plain strings; values opaque bytes.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Stores `value` under `key`, replacing an earlier value.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // Returns the value of `key`, waiting up to `timeout` for it to be set.
  // DEADLINE_EXCEEDED (naming the key) when it is still missing then.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;

  // Waits up to `timeout` until every key is set. DEADLINE_EXCEEDED names the missing keys.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

}  // namespace stagecoach::transport
