// Scraping a daemon's Prometheus endpoint in tests: a minimal HTTP/1.0 GET over a socket and a
// parser of the text exposition format into sample values.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stagecoach::testing {

// GETs http://`host_port``path` (HOST:PORT, IPv4 or a name) and returns the body of a 200
// answer. UNAVAILABLE when it cannot connect, DEADLINE_EXCEEDED after `timeout`, INTERNAL for
// another status or a malformed answer; each names the URL.
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout);

// Samples of a text exposition, keyed by the series as written: `name` or
// `name{label="value",...}` (prometheus-cpp writes labels sorted by name). Comment lines are
// skipped. INVALID_ARGUMENT quoting a line that is not `series value`.
absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(const std::string& text);

// GETs /metrics from `host_port` and parses it.
absl::StatusOr<std::map<std::string, double>> Scrape(const std::string& host_port,
                                                     absl::Duration timeout = absl::Seconds(10));

}  // namespace stagecoach::testing
