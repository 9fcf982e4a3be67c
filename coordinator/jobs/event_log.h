// A job's event log, as WatchJob streams it: state changes and completed steps numbered from 0
// in the order they were recorded, of which the newest `capacity` are kept. A watcher that asks
// for events older than the oldest kept one gets the kept ones and learns what it missed
// (EventLog::Since), so the log of a job that runs for months stays bounded. Events are kept
// serialized (about 100 bytes for a step's, against about 600 as message objects): the 10,000
// a job keeps by default take about 1 MB.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::coordinator {

// Not thread-safe: the job table's lock guards it with the rest of its job. Copyable.
class EventLog {
 public:
  // Keeps at most `capacity` (>= 1; smaller values keep 1) events.
  explicit EventLog(int64_t capacity = 10000);

  void set_capacity(int64_t capacity);
  int64_t capacity() const { return capacity_; }

  // Numbers `event` (the next sequence number), stamps it with `job_id` and `now`, and appends
  // it; the oldest event is dropped when the log is full.
  void Add(v1::JobEvent event, const std::string& job_id, absl::Time now);

  // Sequence number the next event gets (= events recorded so far, kept or not).
  int64_t next_sequence() const { return first_kept_ + static_cast<int64_t>(events_.size()); }
  // Sequence number of the oldest kept event (next_sequence() when none is kept).
  int64_t first_kept() const { return first_kept_; }
  int64_t size() const { return static_cast<int64_t>(events_.size()); }

  // What a watcher resuming at `from` gets.
  struct Slice {
    // Kept events with sequence >= max(from, first_kept()), oldest first.
    std::vector<v1::JobEvent> events;
    // Events [from, first_kept()) were dropped before the watcher read them: it resumes from
    // first_kept(). Both 0 when nothing it asked for was dropped.
    int64_t dropped_from = 0;
    int64_t dropped_to = 0;
  };
  Slice Since(int64_t from) const;

 private:
  int64_t capacity_;
  int64_t first_kept_ = 0;
  std::deque<std::string> events_;  // serialized v1::JobEvent
};

}  // namespace stagecoach::coordinator
