#include "coordinator/jobs/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job_store.h"

namespace stagecoach::coordinator {

JobTable::JobTable(JobTableOptions options, JobWriter* writer)
    : options_(options), writer_(writer) {}

Job& JobTable::CreateLocked() {
  const int64_t number = next_number_++;
  auto job = std::make_shared<Job>();
  job->id = absl::StrCat("job-", number);
  job->events.set_capacity(options_.max_job_events);
  Job& out = *job;
  jobs_.emplace(number, std::move(job));
  return out;
}

absl::Status JobTable::InsertLocked(std::shared_ptr<Job> job) {
  const int64_t number = JobNumber(job->id);
  if (number < 0) {
    return absl::InvalidArgumentError(absl::StrCat("job id '", job->id, "' is not job-<n>"));
  }
  job->events.set_capacity(options_.max_job_events);
  if (!jobs_.emplace(number, std::move(job)).second) {
    return absl::AlreadyExistsError(absl::StrCat("job-", number, " is in the table twice"));
  }
  next_number_ = std::max(next_number_, number + 1);
  return absl::OkStatus();
}

Job* JobTable::FindLocked(const std::string& id) {
  const int64_t number = JobNumber(id);
  auto it = jobs_.find(number);
  if (number < 0 || it == jobs_.end() || it->second->id != id) return nullptr;
  return it->second.get();
}

absl::StatusOr<Job*> JobTable::FindOrErrorLocked(const std::string& id) {
  Job* job = FindLocked(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return job;
}

std::shared_ptr<Job> JobTable::ShareLocked(const std::string& id) {
  auto it = jobs_.find(JobNumber(id));
  if (it == jobs_.end() || it->second->id != id) return nullptr;
  return it->second;
}

std::vector<Job*> JobTable::AllLocked() {
  std::vector<Job*> out;
  out.reserve(jobs_.size());
  for (auto& [number, job] : jobs_) out.push_back(job.get());
  return out;
}

void JobTable::PersistLocked(const Job& job) {
  if (writer_ == nullptr) return;
  v1::Job record;
  job.ToRecord(&record);
  writer_->Save(std::move(record));
}

std::vector<std::string> JobTable::PruneLocked(absl::Time now) {
  // Finished jobs, most recently finished first.
  std::vector<std::pair<absl::Time, int64_t>> finished;
  for (const auto& [number, job] : jobs_) {
    // A job whose StartTask calls are still in flight keeps its entry until they return (they
    // stop what they started and release its workers through it).
    if (job->starting) continue;
    if (std::optional<absl::Time> at = job->FinishedTime()) finished.emplace_back(*at, number);
  }
  std::sort(finished.begin(), finished.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int64_t> drop;
  const absl::Time oldest_kept = now - options_.retain_finished_for;
  for (size_t i = 0; i < finished.size(); ++i) {
    const bool too_many = static_cast<int64_t>(i) >= options_.retain_finished_jobs;
    if (too_many || finished[i].first < oldest_kept) drop.push_back(finished[i].second);
  }
  std::sort(drop.begin(), drop.end());
  std::vector<std::string> out;
  for (int64_t number : drop) {
    auto it = jobs_.find(number);
    out.push_back(it->second->id);
    if (writer_ != nullptr) writer_->Remove(it->second->id);
    jobs_.erase(it);
  }
  return out;
}

absl::StatusOr<JobPage> JobTable::List(int page_size, const std::string& page_token) {
  if (page_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be >= 0 (0 for the default), got ", page_size));
  }
  if (page_size == 0) page_size = options_.default_page_size;
  page_size = std::min(page_size, options_.max_page_size);
  int64_t after = 0;  // the page starts after this job number
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &after) || after < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token: '", page_token, "' is not a token of this coordinator's ListJobs"));
  }
  JobPage page;
  absl::MutexLock lock(&mu_);
  auto it = jobs_.upper_bound(after);
  for (; it != jobs_.end() && static_cast<int>(page.jobs.size()) < page_size; ++it) {
    it->second->ToSummary(&page.jobs.emplace_back());
  }
  if (it != jobs_.end() && !page.jobs.empty()) {
    page.next_page_token = absl::StrCat(JobNumber(page.jobs.back().id()));
  }
  return page;
}

}  // namespace stagecoach::coordinator
