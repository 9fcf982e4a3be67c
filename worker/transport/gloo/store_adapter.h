// Internal to the Gloo backend: presents a RendezvousStore as the gloo::rendezvous::Store that
// gloo's rendezvous (Context::connectFullMesh) talks to.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/transport/rendezvous_store.h"

namespace stagecoach::transport::gloo_internal {

// Prefixes every key with `prefix`, and bounds every call by one `deadline` shared by the
// whole rendezvous (gloo's own per-call timeouts are ignored). Gloo's interface reports errors
// by throwing: a failed call throws gloo::IoException and remembers the store's Status, which
// status() returns so that the caller can report it with its own code (DEADLINE_EXCEEDED
// naming the missing keys, ...). Not thread-safe; gloo calls it from one thread.
class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousStore* store, std::string prefix, absl::Time deadline);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The error of the first call that failed; OK if none did.
  const absl::Status& status() const { return status_; }

 private:
  absl::Duration Remaining() const;
  // Records `status` (when it is the first error) and throws it to gloo.
  [[noreturn]] void Throw(const absl::Status& status);

  RendezvousStore* const store_;
  const std::string prefix_;
  const absl::Time deadline_;
  absl::Status status_;
};

}  // namespace stagecoach::transport::gloo_internal
