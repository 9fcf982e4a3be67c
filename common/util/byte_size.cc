#include "common/util/byte_size.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace stagecoach::util {

std::string FormatBytes(double bytes) {
  if (!std::isfinite(bytes) || bytes < 1024) return absl::StrFormat("%.0f B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = bytes / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

}  // namespace stagecoach::util
