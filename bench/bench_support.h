// What every benchmark program shares: stop with a message on an error, and the median of
// repeated measurements.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stagecoach::bench {

// Prints "<what>: <status>" to stderr and exits 1.
[[noreturn]] inline void Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

inline void Check(const std::string& what, const absl::Status& status) {
  if (!status.ok()) Fail(what, status);
}

// The value, or Fail.
template <typename T>
T Value(const std::string& what, absl::StatusOr<T> value) {
  if (!value.ok()) Fail(what, value.status());
  return std::move(value).value();
}

// The median (the mean of the middle two for an even count); 0 for no values.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace stagecoach::bench
