// Byte counts for people: "512 B", "1.5 KiB", "3.2 GiB" (powers of 1024). Pure functions.
#pragma once

#include <string>

namespace stagecoach::util {

// Below 1 KiB the whole number and " B"; above, one decimal and the largest binary unit up to
// TiB that keeps the value >= 1 ("12.3 MiB"). Negative or non-finite values print as numbers
// of bytes ("-5 B", "inf B").
std::string FormatBytes(double bytes);

}  // namespace stagecoach::util
