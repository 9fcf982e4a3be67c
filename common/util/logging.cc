#include "common/util/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace stagecoach {

absl::Status InitLogging(absl::string_view name, absl::string_view level) {
  spdlog::level::level_enum lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-level: must be one of trace, debug, info, warn, error, off; got '", level, "'"));
  }
  auto logger = spdlog::stderr_color_mt(std::string(name));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n] %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace stagecoach
