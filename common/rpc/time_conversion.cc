#include "common/rpc/time_conversion.h"

#include <cstdint>

namespace stagecoach::rpc {

google::protobuf::Duration ToProtoDuration(absl::Duration d) {
  google::protobuf::Duration out;
  const int64_t nanos = absl::ToInt64Nanoseconds(d);
  out.set_seconds(nanos / 1000000000);
  out.set_nanos(static_cast<int32_t>(nanos % 1000000000));
  return out;
}

absl::Duration FromProtoDuration(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

google::protobuf::Timestamp ToProtoTimestamp(absl::Time t) {
  google::protobuf::Timestamp out;
  const int64_t nanos = absl::ToUnixNanos(t);
  int64_t seconds = nanos / 1000000000;
  int64_t rest = nanos % 1000000000;
  if (rest < 0) {
    rest += 1000000000;
    --seconds;
  }
  out.set_seconds(seconds);
  out.set_nanos(static_cast<int32_t>(rest));
  return out;
}

absl::Time FromProtoTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

}  // namespace stagecoach::rpc
