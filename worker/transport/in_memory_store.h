// A RendezvousStore in the memory of one process, for ranks that are threads of that process:
// tests, and a runtime that runs every rank of a job in one process.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/rendezvous_store.h"

namespace stagecoach::transport {

// Thread-safe. Get and Wait block the calling thread (at most `timeout`) until another thread
// Sets the keys they wait for. The store must outlive every call into it.
class InMemoryStore final : public RendezvousStore {
 public:
  InMemoryStore() = default;
  InMemoryStore(const InMemoryStore&) = delete;
  InMemoryStore& operator=(const InMemoryStore&) = delete;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  // Waits until every key in `keys` is set or `deadline`; returns the keys still missing.
  std::vector<std::string> AwaitKeys(const std::vector<std::string>& keys, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::CondVar changed_;  // Signalled on every Set.
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagecoach::transport
