// A fixed pool of threads running closures in FIFO order: the daemons' Executor, which runs
// calls to remote services and disk I/O without holding locks.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/util/executor.h"

namespace stagecoach {

// Thread-safe.
class WorkQueue : public Executor {
 public:
  explicit WorkQueue(int threads);
  // Runs what is queued, then joins the threads.
  ~WorkQueue();

  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `fn`. After shutdown started, `fn` is dropped.
  void Enqueue(std::function<void()> fn);
  void Run(std::function<void()> fn) override { Enqueue(std::move(fn)); }

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace stagecoach
