// The rendezvous key-value store through which the ranks of a job bootstrap their data plane
// (Gloo peer addresses, NCCL unique ids). Values are small and live only as long as the job
// attempt that wrote them (DeletePrefix when it ends).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stagecoach::coordinator {

// Thread-safe.
class KvStore {
 public:
  // Limits that keep a misbehaving client from exhausting the coordinator's memory.
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  static constexpr size_t kMaxKeys = 100000;

  // Stores `value` under `key`, waking waiters. INVALID_ARGUMENT for an empty or oversized key
  // or value; RESOURCE_EXHAUSTED when the store is full.
  absl::Status Set(const std::string& key, std::string value);

  // Returns the value of `key`, waiting up to `wait` for it. DEADLINE_EXCEEDED names the key.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration wait);

  // Waits up to `wait` for every key. DEADLINE_EXCEEDED names the missing ones.
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration wait);

  // Removes every key starting with `prefix`; returns how many.
  int DeletePrefix(const std::string& prefix);

  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagecoach::coordinator
