#include "coordinator/workers/kv_store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagecoach::coordinator {

absl::Status KvStore::Set(const std::string& key, std::string value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: must be 1..", kMaxKeyBytes, " bytes, got ", key.size()));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of key '", key, "': must be at most ",
                                                   kMaxValueBytes, " bytes, got ", value.size()));
  }
  absl::MutexLock lock(&mu_);
  if (values_.size() >= kMaxKeys && values_.count(key) == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous store is full (", kMaxKeys, " keys)"));
  }
  values_[key] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvStore::Get(const std::string& key, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; };
  mu_.AwaitWithTimeout(absl::Condition(&present), wait);
  auto it = values_.find(key);
  if (it == values_.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous key '", key, "' was not set within ", absl::FormatDuration(wait)));
  }
  return it->second;
}

absl::Status KvStore::Wait(const std::vector<std::string>& keys, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& k : keys) {
      if (values_.count(k) == 0) return false;
    }
    return true;
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&all_present), wait)) return absl::OkStatus();
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (values_.count(k) == 0) missing.push_back(k);
  }
  return absl::DeadlineExceededError(absl::StrCat("rendezvous keys not set within ",
                                                  absl::FormatDuration(wait), ": ",
                                                  absl::StrJoin(missing, ", ")));
}

int KvStore::DeletePrefix(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  int removed = 0;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    it = values_.erase(it);
    ++removed;
  }
  return removed;
}

size_t KvStore::size() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

}  // namespace stagecoach::coordinator
