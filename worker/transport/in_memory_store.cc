#include "worker/transport/in_memory_store.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stagecoach::transport {

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const std::vector<std::string> missing = AwaitKeys({key}, absl::Now() + timeout);
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrFormat("rendezvous key \"%s\" not set within %s",
                                                       key, absl::FormatDuration(timeout)));
  }
  return values_.at(key);
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const std::vector<std::string> missing = AwaitKeys(keys, absl::Now() + timeout);
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrFormat("rendezvous keys not set within %s: \"%s\"",
                                                       absl::FormatDuration(timeout),
                                                       absl::StrJoin(missing, "\", \"")));
  }
  return absl::OkStatus();
}

std::vector<std::string> InMemoryStore::AwaitKeys(const std::vector<std::string>& keys,
                                                  absl::Time deadline) {
  for (;;) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (values_.find(key) == values_.end()) missing.push_back(key);
    }
    if (missing.empty() || absl::Now() >= deadline) return missing;
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

}  // namespace stagecoach::transport
