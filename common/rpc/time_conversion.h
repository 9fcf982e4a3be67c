// absl time types <-> google.protobuf.Duration / Timestamp.
#pragma once

#include <google/protobuf/duration.pb.h>
#include <google/protobuf/timestamp.pb.h>

#include "absl/time/time.h"

namespace stagecoach::rpc {

google::protobuf::Duration ToProtoDuration(absl::Duration d);
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);
google::protobuf::Timestamp ToProtoTimestamp(absl::Time t);
absl::Time FromProtoTimestamp(const google::protobuf::Timestamp& t);

}  // namespace stagecoach::rpc
