#include "common/util/byte_size.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < stripped.size() &&
         (absl::ascii_isdigit(stripped[digits]) || stripped[digits] == '.')) {
    ++digits;
  }
  const absl::string_view number = stripped.substr(0, digits);
  const std::string unit =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(stripped.substr(digits)));
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},         {"b", 1},    {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40}, {"kb", 1e3}, {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12}};
  double scale = 0;
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) scale = factor;
  }
  double value = 0;
  if (number.empty() || scale == 0 || !absl::SimpleAtod(number, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text,
                     "' is not a byte size (a number of bytes, or a number and a unit: B, KiB, "
                     "MiB, GiB, TiB, KB, MB, GB, TB; e.g. 8GiB)"));
  }
  const double bytes = std::round(value * scale);
  if (bytes >= 0x1p63) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is over 2^63-1 bytes"));
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace stagecoach::util
