// One write at a time off the caller's thread: what an asynchronous checkpoint runs (pickling,
// hashing, the durable writes and the report of the files) while the task's thread trains on.
//
// Contract:
//  - Start runs `write` on a thread of its own. At most one write is in flight: Start first waits
//    for the previous one, up to `timeout` (DEADLINE_EXCEEDED saying what was waited for; then
//    `write` is not started). A previous write that failed makes Start and Drain return its
//    error once (the caller fails the task), and `write` is not started.
//  - Drain waits for the write in flight (up to `timeout`) and returns its error, if any.
//  - The destructor waits for the write in flight, however long it takes (it owns its data and
//    the caller's objects it uses must outlive it); `abandoned()` tells a write that its result
//    is no longer wanted (the task ended without draining).
// Thread-safe.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stagecoach::runtime {

class BackgroundWriter {
 public:
  // `what` names the writes in errors ("rank 1's checkpoint").
  BackgroundWriter(std::string what, absl::Duration timeout);
  ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  absl::Status Start(std::function<absl::Status()> write);
  absl::Status Drain();

  // Whether the owner is being destroyed: a write still running may skip what only matters to
  // a live task (reporting its files).
  bool abandoned() const;

 private:
  // Waits for the write in flight and joins its thread; its error, once.
  absl::Status Wait();

  const std::string what_;
  const absl::Duration timeout_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagecoach::runtime
