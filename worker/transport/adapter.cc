#include "worker/transport/adapter.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stagecoach::transport::adapter {

std::string Hex(uint64_t value) { return absl::StrFormat("0x%x", value); }

std::string TransferLabel(int rank, absl::string_view what, int peer, uint64_t tag, size_t bytes) {
  return absl::StrFormat("rank %d: %s rank %d (tag %s, %d bytes)", rank, what, peer, Hex(tag),
                         bytes);
}

absl::Status Cancelled(absl::string_view what, bool destroyed) {
  return absl::CancelledError(
      absl::StrCat(what, " cancelled: the transport was ", destroyed ? "destroyed" : "aborted"));
}

absl::Status TimedOut(absl::string_view what, absl::Duration timeout, absl::string_view hint) {
  return absl::DeadlineExceededError(
      absl::StrFormat("%s timed out after %s (%s)", what, absl::FormatDuration(timeout), hint));
}

}  // namespace stagecoach::transport::adapter
