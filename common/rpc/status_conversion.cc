#include "common/rpc/status_conversion.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util/utf8.h"

namespace stagecoach::rpc {

namespace {

// Bytes `c` takes in grpc-message: printable ASCII but '%' as is, the rest as %XX.
size_t EncodedBytes(char c) { return (c >= 0x20 && c <= 0x7E && c != '%') ? 1 : 3; }

size_t EncodedSize(absl::string_view text) {
  size_t n = 0;
  for (char c : text) n += EncodedBytes(c);
  return n;
}

// The longest prefix of `text` whose encoded size is at most `budget`, at a UTF-8 boundary.
absl::string_view EncodedPrefix(absl::string_view text, size_t budget) {
  size_t end = 0;
  for (size_t used = 0; end < text.size() && used + EncodedBytes(text[end]) <= budget; ++end) {
    used += EncodedBytes(text[end]);
  }
  return util::Utf8Prefix(text, end);
}

}  // namespace

std::string SummarizeErrorMessage(absl::string_view message, size_t max_encoded) {
  if (EncodedSize(message) <= max_encoded) return std::string(message);
  const std::vector<absl::string_view> lines = absl::StrSplit(message, '\n');
  // Room for the closing line, whatever K and N are.
  constexpr size_t kTail = 96;
  const size_t budget = max_encoded > kTail ? max_encoded - kTail : 0;
  std::string out;
  size_t used = 0, shown = 0;
  for (absl::string_view line : lines) {
    const size_t cost = EncodedSize(line) + (out.empty() ? 0 : 3);  // "\n" encodes as %0A
    if (used + cost <= budget) {
      if (!out.empty()) out += '\n';
      absl::StrAppend(&out, line);
      used += cost;
      ++shown;
      continue;
    }
    if (shown == 0) {  // the first error alone is too long: cut it
      absl::StrAppend(&out, EncodedPrefix(line, budget > 3 ? budget - 3 : 0), "...");
      ++shown;
    }
    break;
  }
  const size_t more = lines.size() - shown;
  if (more == 0) {
    absl::StrAppend(&out, "\n(cut: ", message.size(), " bytes in all)");
  } else {
    absl::StrAppend(&out, "\n... and ", more, " more error", more == 1 ? "" : "s", " (",
                    message.size(), " bytes in all)");
  }
  return out;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      SummarizeErrorMessage(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status CallError(const grpc::Status& status, absl::string_view call, absl::string_view peer) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(call, " on ", peer, ": ", status.error_message()));
}

}  // namespace stagecoach::rpc
