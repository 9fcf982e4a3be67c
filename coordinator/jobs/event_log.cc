#include "coordinator/jobs/event_log.h"

#include <algorithm>

#include "common/rpc/time_conversion.h"

namespace stagecoach::coordinator {

EventLog::EventLog(int64_t capacity) : capacity_(std::max<int64_t>(capacity, 1)) {}

void EventLog::set_capacity(int64_t capacity) {
  capacity_ = std::max<int64_t>(capacity, 1);
  while (size() > capacity_) {
    events_.pop_front();
    ++first_kept_;
  }
}

void EventLog::Add(v1::JobEvent event, const std::string& job_id, absl::Time now) {
  event.set_job_id(job_id);
  event.set_sequence(next_sequence());
  *event.mutable_time() = rpc::ToProtoTimestamp(now);
  events_.push_back(event.SerializeAsString());
  if (size() > capacity_) {
    events_.pop_front();
    ++first_kept_;
  }
}

EventLog::Slice EventLog::Since(int64_t from) const {
  Slice out;
  from = std::max<int64_t>(from, 0);
  if (from < first_kept_) {
    out.dropped_from = from;
    out.dropped_to = first_kept_;
    from = first_kept_;
  }
  for (int64_t seq = from; seq < next_sequence(); ++seq) {
    // Written by Add from a valid message: parsing it back cannot fail.
    out.events.emplace_back().ParseFromString(events_[static_cast<size_t>(seq - first_kept_)]);
  }
  return out;
}

}  // namespace stagecoach::coordinator
