// Where a component runs work it must not do under its own locks: calls to other processes and
// disk I/O. Injected (STYLE.md rule 10) so that production runs the work on a thread pool
// (WorkQueue) and unit tests run it on their own thread, when they choose (ManualExecutor), with
// no sleeps or polling.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "absl/synchronization/mutex.h"

namespace stagecoach {

// Thread-safe.
class Executor {
 public:
  virtual ~Executor() = default;

  // Runs `fn` later, on some thread, never inline in the caller (callers may hold locks that
  // `fn` takes). Closures queued after the executor began shutting down may be dropped.
  virtual void Run(std::function<void()> fn) = 0;
};

// An executor that runs nothing until told to: RunUntilIdle runs the queued closures, and those
// they queue, on the calling thread. For tests. Thread-safe.
class ManualExecutor : public Executor {
 public:
  void Run(std::function<void()> fn) override;

  // Runs queued closures in FIFO order until none is left; returns how many ran. Closures
  // queued meanwhile (by the closures themselves or other threads) run too.
  int64_t RunUntilIdle();

  // Closures waiting to run.
  int64_t pending();

 private:
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
};

// Lets a component queue closures that use it on an executor that may outlive it. Wrap(fn)
// gives a closure that runs `fn` only while the scope is open; Close() (first thing in the
// component's destructor) waits for wrapped closures that are running and turns the others into
// no-ops. Thread-safe. A wrapped closure must not call Close() of its own scope.
class TaskScope {
 public:
  TaskScope();
  ~TaskScope();  // Close()

  TaskScope(const TaskScope&) = delete;
  TaskScope& operator=(const TaskScope&) = delete;

  std::function<void()> Wrap(std::function<void()> fn);
  void Close();

 private:
  struct State {
    absl::Mutex mu;
    int running ABSL_GUARDED_BY(mu) = 0;
    bool closed ABSL_GUARDED_BY(mu) = false;
  };
  std::shared_ptr<State> state_;
};

}  // namespace stagecoach
