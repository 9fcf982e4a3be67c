#include "worker/transport/connect_options.h"

#include "absl/strings/str_format.h"

namespace stagecoach::transport {

absl::Status ValidateConnectOptions(absl::string_view creator, const ConnectOptions& options,
                                    const RendezvousStore* store) {
  if (store == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: store is null", creator));
  }
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: rank %d is not in [0, %d)", creator,
                                                      options.rank, options.world_size));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: connect_timeout %s is not positive", creator,
                        absl::FormatDuration(options.connect_timeout)));
  }
  return absl::OkStatus();
}

}  // namespace stagecoach::transport
