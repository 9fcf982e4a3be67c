#include "coordinator/diagnosis/progress_inbox.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace stagecoach::coordinator {

void ProgressInbox::Post(const std::string& worker_id, const v1::RankProgress& progress,
                         absl::Time received) {
  std::string key = absl::StrCat(worker_id, " ", progress.job_id());
  absl::MutexLock lock(&mu_);
  Posted& p = latest_[std::move(key)];
  p.worker_id = worker_id;
  p.progress = progress;
  p.received = received;
}

std::vector<ProgressInbox::Posted> ProgressInbox::Take() {
  absl::flat_hash_map<std::string, Posted> taken;
  {
    absl::MutexLock lock(&mu_);
    taken.swap(latest_);
  }
  std::vector<Posted> out;
  out.reserve(taken.size());
  for (auto& [key, posted] : taken) out.push_back(std::move(posted));
  return out;
}

}  // namespace stagecoach::coordinator
