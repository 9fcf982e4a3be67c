// Fakes for coordinator unit tests: a WorkerClient that records calls and fails on demand.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/worker_client.h"

namespace stagecoach::coordinator {

class FakeWorkerClient : public WorkerClient {
 public:
  absl::Status StartTask(const std::string& address, const v1::TaskAssignment& task,
                         absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (unreachable_.count(address)) return absl::UnavailableError("connection refused");
    started_[address].push_back(task);
    return absl::OkStatus();
  }
  absl::Status StopTask(const std::string& address, const std::string& job_id, const std::string&,
                        absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (unreachable_.count(address)) return absl::UnavailableError("connection refused");
    stopped_[address].push_back(job_id);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::GetWorkerStatusResponse> GetStatus(const std::string& address,
                                                        absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (unreachable_.count(address)) return absl::UnavailableError("connection refused");
    return v1::GetWorkerStatusResponse();
  }

  void SetUnreachable(const std::string& address) {
    absl::MutexLock lock(&mu_);
    unreachable_.insert(address);
  }
  std::vector<v1::TaskAssignment> Started(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return started_[address];
  }
  std::vector<std::string> Stopped(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return stopped_[address];
  }

 private:
  absl::Mutex mu_;
  std::set<std::string> unreachable_;
  std::map<std::string, std::vector<v1::TaskAssignment>> started_;
  std::map<std::string, std::vector<std::string>> stopped_;
};

}  // namespace stagecoach::coordinator
