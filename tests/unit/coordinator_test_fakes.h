// Fakes for coordinator unit tests: a WorkerClient that records calls and fails on demand.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/spec/spec_parser.h"
#include "common/util/clock.h"
#include "common/util/executor.h"
#include "coordinator/job_manager.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/workers/kv_store.h"
#include "coordinator/workers/worker_client.h"
#include "gtest/gtest.h"

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
  // Answers with what SetInspection set (OK with no layers when nothing was), and records the
  // request under the address.
  absl::StatusOr<v1::InspectModelResponse> InspectModel(const std::string& address,
                                                        const v1::InspectModelRequest& request,
                                                        absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (unreachable_.count(address)) return absl::UnavailableError("connection refused");
    inspected_[address].push_back(request);
    return inspection_;
  }

  // Records the request; answers what SetCheckpointAnswer set for the address (OK when
  // nothing was).
  absl::Status RequestCheckpoint(const std::string& address, const std::string& job_id,
                                 int64_t step, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (unreachable_.count(address)) return absl::UnavailableError("connection refused");
    checkpoint_requests_[address].emplace_back(job_id, step);
    auto it = checkpoint_answers_.find(address);
    if (it == checkpoint_answers_.end()) return absl::OkStatus();
    return it->second(step);
  }
  // How RequestCheckpoint on `address` answers a requested step from now on.
  void SetCheckpointAnswer(const std::string& address,
                           std::function<absl::Status(int64_t step)> answer) {
    absl::MutexLock lock(&mu_);
    checkpoint_answers_[address] = std::move(answer);
  }
  // (job id, step) of every RequestCheckpoint call on `address`, in order.
  std::vector<std::pair<std::string, int64_t>> CheckpointRequests(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return checkpoint_requests_[address];
  }

  // Records the request; answers what SetControlAnswer set for the address (OK, with the
  // request's step limit as the steps done, when nothing was).
  // The answer runs without the fake's lock, so one that blocks (a frozen worker) delays only
  // its own caller.
  absl::StatusOr<v1::ControlTaskResponse> ControlTask(const std::string& address,
                                                      const v1::ControlTaskRequest& request,
                                                      absl::Duration) override {
    std::function<absl::StatusOr<v1::ControlTaskResponse>(const v1::ControlTaskRequest&)> answer;
    {
      absl::MutexLock lock(&mu_);
      if (unreachable_.count(address)) return absl::UnavailableError("connection refused");
      controls_[address].push_back(request);
      auto it = control_answers_.find(address);
      if (it != control_answers_.end()) answer = it->second;
    }
    if (answer) return answer(request);
    v1::ControlTaskResponse response;
    response.set_global_steps_done(request.step_limit());
    return response;
  }
  void SetControlAnswer(
      const std::string& address,
      std::function<absl::StatusOr<v1::ControlTaskResponse>(const v1::ControlTaskRequest&)>
          answer) {
    absl::MutexLock lock(&mu_);
    control_answers_[address] = std::move(answer);
  }
  // Every ControlTask request sent to `address`, in order.
  std::vector<v1::ControlTaskRequest> Controls(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return controls_[address];
  }
  void SetSessionToken(const std::string& address, const std::string& token) override {
    absl::MutexLock lock(&mu_);
    tokens_[address] = token;
  }
  std::string SessionToken(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return tokens_[address];
  }

  // What InspectModel answers from now on.
  void SetInspection(absl::StatusOr<v1::InspectModelResponse> inspection) {
    absl::MutexLock lock(&mu_);
    inspection_ = std::move(inspection);
  }
  std::vector<v1::InspectModelRequest> Inspected(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return inspected_[address];
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
  absl::StatusOr<v1::InspectModelResponse> inspection_ = v1::InspectModelResponse();
  std::map<std::string, std::vector<v1::InspectModelRequest>> inspected_;
  std::map<std::string, std::vector<std::pair<std::string, int64_t>>> checkpoint_requests_;
  std::map<std::string, std::function<absl::Status(int64_t)>> checkpoint_answers_;
  std::map<std::string, std::vector<v1::ControlTaskRequest>> controls_;
  std::map<std::string,
           std::function<absl::StatusOr<v1::ControlTaskResponse>(const v1::ControlTaskRequest&)>>
      control_answers_;
  std::map<std::string, std::string> tokens_;
};

// A job spec the control tests run: a 4-layer MLP in 2 stages on 2 workers, 1F1B with 4
// microbatches of 2 rows, `steps` steps, and `extra` YAML appended.
inline std::string TwoStageSpec(int steps, const std::string& extra = "") {
  return absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n",
                      "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 4}\n",
                      "training: {batch_size: 8, steps: ", steps, "}\n", extra);
}

// A planned job of `spec_yaml` queued in `table` (PENDING at `now`), as admission and
// JobManager make it.
// The caller holds table.mu().
inline Job& QueuePlannedJob(JobTable& table, const std::string& spec_yaml, absl::Time now) {
  Job& job = table.CreateLocked();
  auto spec = spec::ParseJobSpec(spec_yaml, "spec");
  EXPECT_TRUE(spec.ok()) << spec.status();
  job.spec = *spec;
  job.spec_yaml = spec_yaml;
  auto plan = PlanJob(job.spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  job.plan = *plan;
  job.finish_step = job.spec.training.steps;
  EXPECT_TRUE(job.TransitionTo(v1::JOB_STATE_PLANNING, "submitted", now).ok());
  EXPECT_TRUE(job.TransitionTo(v1::JOB_STATE_PENDING, "planned", now).ok());
  return job;
}

// A float32 tensor of `shape` holding `values`.
inline v1::TensorData FloatTensor(const std::vector<int64_t>& shape,
                                  const std::vector<float>& values) {
  v1::TensorData t;
  t.set_dtype("float32");
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  return t;
}

// A float32 [rows, cols] tensor of zeros, as a client batch.
inline v1::TensorData ZeroFloats(int64_t rows, int64_t cols) {
  v1::TensorData t;
  t.set_dtype("float32");
  t.add_shape(rows);
  t.add_shape(cols);
  t.set_data(std::string(static_cast<size_t>(rows * cols * 4), '\0'));
  return t;
}

// A job store in memory that records every call; Save can be made to block on a latch (a slow
// or stuck disk).
class MemoryJobStore : public JobStore {
 public:
  absl::Status Save(const v1::Job& job) override {
    absl::Notification* block = nullptr;
    {
      absl::MutexLock lock(&mu_);
      block = block_;
    }
    if (block != nullptr) {
      if (!entered_.HasBeenNotified()) entered_.Notify();
      block->WaitForNotification();
    }
    absl::MutexLock lock(&mu_);
    records_[job.id()] = job;
    calls_.push_back(absl::StrCat("save ", job.id(), " ", v1::JobState_Name(job.state())));
    return absl::OkStatus();
  }
  absl::Status Remove(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    records_.erase(job_id);
    calls_.push_back(absl::StrCat("remove ", job_id));
    return absl::OkStatus();
  }
  std::vector<v1::Job> LoadAll(std::vector<std::string>*) override {
    absl::MutexLock lock(&mu_);
    std::vector<v1::Job> out;
    for (const auto& [id, job] : records_) out.push_back(job);
    return out;
  }
  std::string Describe() const override { return "memory"; }

  // Saves block until `release` is notified; entered() is notified when the first one blocks.
  void BlockSaves(absl::Notification* release) {
    absl::MutexLock lock(&mu_);
    block_ = release;
  }
  absl::Notification& entered() { return entered_; }

  std::vector<std::string> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::set<std::string> ids() {
    absl::MutexLock lock(&mu_);
    std::set<std::string> out;
    for (const auto& [id, job] : records_) out.insert(id);
    return out;
  }

 private:
  absl::Notification entered_;
  absl::Mutex mu_;
  absl::Notification* block_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, v1::Job> records_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

// A JobManager over a fake clock, fake workers, a real KV store and a manual executor (the
// manager's calls to workers and disk writes run when the test settles it), with CPU workers
// that register at 10.0.0.N:7000.
class JobManagerFixture : public ::testing::Test {
 protected:
  JobManagerFixture() {
    JobManagerOptions options;
    options.lease = absl::Seconds(5);
    options.heartbeat_interval = absl::Seconds(1);
    manager_ = std::make_unique<JobManager>(options, Deps());
  }
  ~JobManagerFixture() override {
    manager_.reset();
    executor_.RunUntilIdle();  // closures of the manager's, now no-ops
  }

  JobManagerDeps Deps(JobStore* store = nullptr) {
    JobManagerDeps deps{&clock_, &workers_, &kv_};
    deps.store = store;
    deps.executor = &executor_;
    return deps;
  }

  // Runs what the manager queued (calls to the fake workers, manifest and record writes) and
  // what that queued in turn, on this thread.
  void Settle() { executor_.RunUntilIdle(); }

  // The job once the manager's queued work (calls to workers, checkpoint manifests) has run,
  // and its state.
  v1::Job Job(const std::string& id) {
    Settle();
    auto job = manager_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }
  v1::JobState State(const std::string& id) { return Job(id).state(); }

  // Settles, then checks `cond`. Only a test that calls the manager on another thread of its
  // own (Infer, StepJob) waits beyond that, up to `timeout`, for that thread's progress.
  bool Eventually(const std::function<bool()>& cond, absl::Duration timeout = absl::Seconds(10)) {
    Settle();
    const absl::Time deadline = absl::Now() + timeout;
    while (!cond()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
      Settle();
    }
    return true;
  }

  std::string Register(int n) {
    v1::RegisterWorkerRequest req;
    req.set_name(absl::StrCat("worker", n));
    req.set_address(Address(n));
    req.set_device("cpu");
    auto resp = manager_->RegisterWorker(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    tokens_[resp->worker_id()] = resp->session_token();
    return resp->worker_id();
  }
  // A heartbeat of the registered worker `id`, with its session token.
  absl::Status Beat(const std::string& id) {
    v1::HeartbeatRequest req;
    req.set_worker_id(id);
    req.set_session_token(tokens_[id]);
    return manager_->Heartbeat(req).status();
  }
  static std::string Address(int n) { return absl::StrCat("10.0.0.", n, ":7000"); }

  FakeClock clock_;
  FakeWorkerClient workers_;
  KvStore kv_;
  ManualExecutor executor_;
  std::unique_ptr<JobManager> manager_;
  std::map<std::string, std::string> tokens_;  // session token by worker id
};

}  // namespace stagecoach::coordinator
