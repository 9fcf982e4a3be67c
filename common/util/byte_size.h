// Byte counts for people: "512 B", "1.5 KiB", "3.2 GiB" (powers of 1024). Pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::util {

// Below 1 KiB the whole number and " B"; above, one decimal and the largest binary unit up to
// TiB that keeps the value >= 1 ("12.3 MiB"). Negative or non-finite values print as numbers
// of bytes ("-5 B", "inf B").
std::string FormatBytes(double bytes);

// A byte count as people write it: a whole number of bytes ("1048576"), or a number (decimals
// allowed) followed by a unit, with or without a space: B, KiB, MiB, GiB, TiB (powers of 1024),
// KB, MB, GB, TB (powers of 1000); units are case-insensitive ("8GiB", "1.5 gb", "512MiB").
// INVALID_ARGUMENT saying what is wrong for anything else, for a negative or non-finite
// amount, and for one over INT64_MAX bytes.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

}  // namespace stagecoach::util
