// Latency samples and their percentiles, and what /proc says about a process (CPU time,
// resident memory), for bench/fleet_bench.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace stagecoach::bench {

// Samples in milliseconds.
class Latencies {
 public:
  void Add(absl::Duration d) { ms_.push_back(absl::ToDoubleMilliseconds(d)); }
  void Append(const Latencies& other) { ms_.insert(ms_.end(), other.ms_.begin(), other.ms_.end()); }
  size_t size() const { return ms_.size(); }

  // The nearest-rank percentile p (0..100) in ms; 0 for no samples.
  double Percentile(double p) const {
    if (ms_.empty()) return 0;
    std::vector<double> sorted = ms_;
    std::sort(sorted.begin(), sorted.end());
    const double rank = std::ceil(p / 100 * static_cast<double>(sorted.size()));
    const size_t i = static_cast<size_t>(std::max(1.0, rank)) - 1;
    return sorted[std::min(i, sorted.size() - 1)];
  }
  double Max() const { return ms_.empty() ? 0 : *std::max_element(ms_.begin(), ms_.end()); }

 private:
  std::vector<double> ms_;
};

// user + system CPU seconds of process `pid` so far (/proc/PID/stat); -1 when unreadable.
inline double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  // Fields after the command name (which may hold spaces) start after its closing ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  // state(3) ... utime is field 14 and stime 15 of the whole line: 12th and 13th here.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// VmRSS of process `pid` in MiB (/proc/PID/status); -1 when unreadable.
inline double ResidentMiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return -1;
}

}  // namespace stagecoach::bench
