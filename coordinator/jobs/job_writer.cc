#include "coordinator/jobs/job_writer.h"

#include "common/util/logging.h"

namespace stagecoach::coordinator {

// Shared with the queued drains, so that a drain that runs after the writer is gone is harmless.
struct JobWriter::Core {
  explicit Core(JobStore* s) : store(s) {}

  // Writes queued records, one at a time, until the queue is empty.
  void WriteQueued() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock writing(&write_mu);  // one writer: records of a job stay in order
    while (true) {
      std::string id;
      std::optional<v1::Job> record;
      {
        absl::MutexLock lock(&mu);
        if (order.empty()) return;
        id = std::move(order.front());
        order.pop_front();
        auto it = pending.find(id);
        record = std::move(it->second);
        pending.erase(it);
      }
      const absl::Status written = record.has_value() ? store->Save(*record) : store->Remove(id);
      if (!written.ok()) {
        spdlog::error("{}: job table: {}", id, written.message());
      }
      absl::MutexLock lock(&mu);
      ++done;
    }
  }

  JobStore* const store;
  absl::Mutex write_mu ABSL_ACQUIRED_BEFORE(mu);
  absl::Mutex mu;
  // The latest record of each queued job (nullopt: remove it), and the order they came in.
  std::map<std::string, std::optional<v1::Job>> pending ABSL_GUARDED_BY(mu);
  std::deque<std::string> order ABSL_GUARDED_BY(mu);
  bool scheduled ABSL_GUARDED_BY(mu) = false;
  int64_t done ABSL_GUARDED_BY(mu) = 0;
  Executor* executor = nullptr;
};

JobWriter::JobWriter(JobStore* store, Executor* executor) : core_(std::make_shared<Core>(store)) {
  core_->executor = executor;
}

JobWriter::~JobWriter() { Flush(); }

void JobWriter::Save(v1::Job record) {
  std::string id = record.id();
  Enqueue(core_, std::move(id), std::move(record));
}

void JobWriter::Remove(const std::string& job_id) { Enqueue(core_, job_id, std::nullopt); }

void JobWriter::Flush() { core_->WriteQueued(); }

int64_t JobWriter::writes() const {
  absl::MutexLock lock(&core_->mu);
  return core_->done;
}

void JobWriter::Enqueue(const std::shared_ptr<Core>& core, std::string id,
                        std::optional<v1::Job> record) {
  absl::MutexLock lock(&core->mu);
  auto [it, added] = core->pending.insert_or_assign(id, std::move(record));
  if (added) core->order.push_back(std::move(id));
  if (core->scheduled) return;
  core->scheduled = true;
  core->executor->Run([core] {
    {
      absl::MutexLock lock(&core->mu);
      core->scheduled = false;
    }
    core->WriteQueued();
  });
}

}  // namespace stagecoach::coordinator
