#include "worker/transport/gloo/store_adapter.h"

#include <gloo/common/error.h>

#include <algorithm>
#include <utility>

namespace stagecoach::transport::gloo_internal {

StoreAdapter::StoreAdapter(RendezvousStore* store, std::string prefix, absl::Time deadline)
    : store_(store), prefix_(std::move(prefix)), deadline_(deadline) {}

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Set(prefix_ + key, std::string(data.begin(), data.end()));
  if (!status.ok()) Throw(status);
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  // gloo expects get to wait until the key is set.
  absl::StatusOr<std::string> value = store_->Get(prefix_ + key, Remaining());
  if (!value.ok()) Throw(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void StoreAdapter::wait(const std::vector<std::string>& keys) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(prefix_ + key);
  absl::Status status = store_->Wait(prefixed, Remaining());
  if (!status.ok()) Throw(status);
}

void StoreAdapter::wait(const std::vector<std::string>& keys,
                        const std::chrono::milliseconds& /*timeout*/) {
  wait(keys);
}

absl::Duration StoreAdapter::Remaining() const {
  return std::max(deadline_ - absl::Now(), absl::ZeroDuration());
}

void StoreAdapter::Throw(const absl::Status& status) {
  if (status_.ok()) status_ = status;
  throw ::gloo::IoException(std::string(status.message()));
}

}  // namespace stagecoach::transport::gloo_internal
