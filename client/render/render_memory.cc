#include "client/render/render_memory.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/render/render.h"
#include "common/util/byte_size.h"

namespace stagecoach::client {
namespace {

std::string BytesOrDash(int64_t bytes) {
  return bytes > 0 ? util::FormatBytes(static_cast<double>(bytes)) : "-";
}

}  // namespace

std::string MemoryTable(const v1::Job& job) {
  if (job.memory_size() == 0) return "";
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "STATIC", "PREDICTED PEAK", "AT", "MEASURED PEAK", "OF PREDICTED", "MOST"}};
  for (const v1::RankMemory& m : job.memory()) {
    const bool both = m.predicted_peak_bytes() > 0 && m.measured_peak_bytes() > 0;
    rows.push_back(
        {absl::StrCat(m.rank()), BytesOrDash(m.predicted_static_bytes()),
         BytesOrDash(m.predicted_peak_bytes()),
         m.predicted_peak_action().empty() ? "-" : m.predicted_peak_action(),
         BytesOrDash(m.measured_peak_bytes()),
         both ? absl::StrFormat("%.0f%%", 100.0 * static_cast<double>(m.measured_peak_bytes()) /
                                              static_cast<double>(m.predicted_peak_bytes()))
              : "-",
         BytesOrDash(m.measured_max_bytes())});
  }
  return absl::StrCat(
      "Memory (activation peaks per step; static = parameters, gradients, "
      "optimizer state):\n",
      FormatTable(rows));
}

nlohmann::json MemoryJson(const v1::Job& job) {
  nlohmann::json out = nlohmann::json::array();
  for (const v1::RankMemory& m : job.memory()) {
    out.push_back({{"rank", m.rank()},
                   {"predicted_static_bytes", m.predicted_static_bytes()},
                   {"predicted_peak_bytes", m.predicted_peak_bytes()},
                   {"predicted_peak_action", m.predicted_peak_action()},
                   {"measured_peak_bytes", m.measured_peak_bytes()},
                   {"measured_max_bytes", m.measured_max_bytes()}});
  }
  return out;
}

}  // namespace stagecoach::client
