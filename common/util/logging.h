// Logging: spdlog to stderr, so that a daemon's stdout carries only what scripts read
// (its first line, "listening on HOST:PORT").
#pragma once

#include <spdlog/spdlog.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

// Debian builds Abseil with its own string_view type (not std::string_view); let spdlog/fmt
// format it like any string.
#if !defined(ABSL_USES_STD_STRING_VIEW)
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};
#endif

namespace stagecoach {

// Sets up the default logger for a process named `name` ("coordinator", "worker w-1", ...).
// `level` is one of trace, debug, info, warn, error. INVALID_ARGUMENT for another level.
absl::Status InitLogging(absl::string_view name, absl::string_view level);

}  // namespace stagecoach
