#include "client/render/render_balance.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/render/render.h"

namespace stagecoach::client {
namespace {

std::string TaskName(int task, int num_ranks) {
  if (num_ranks > 0 && task >= num_ranks) {
    return absl::StrCat("replica ", task / num_ranks, " rank ", task % num_ranks);
  }
  return absl::StrCat("rank ", task);
}

std::string Compute(double value, bool seconds) {
  return seconds ? absl::StrFormat("%.2f ms", value * 1e3) : absl::StrFormat("%.1f%%", 100 * value);
}

}  // namespace

std::string BubbleSummary(const std::vector<double>& ratios, int num_ranks) {
  if (ratios.empty()) return "";
  const auto worst = std::max_element(ratios.begin(), ratios.end());
  const double mean = std::accumulate(ratios.begin(), ratios.end(), 0.0) / ratios.size();
  return absl::StrFormat("%.3f mean, %.3f worst (%s)", mean, *worst,
                         TaskName(static_cast<int>(worst - ratios.begin()), num_ranks));
}

std::string BalanceLines(const v1::Job& job) {
  std::string out;
  if (!job.split().empty()) absl::StrAppend(&out, "Split:     ", job.split(), "\n");
  std::vector<double> measured;
  if (job.balance_step() >= 0) {
    for (const v1::RankBalance& b : job.balance()) measured.push_back(b.measured_bubble_ratio());
  }
  const bool history = !job.max_bubble_ratios().empty();
  if (measured.empty() && !history) return out;
  absl::StrAppend(&out, "Bubble:    ");
  if (!measured.empty()) {
    absl::StrAppend(&out, BubbleSummary(measured), " in global step ", job.balance_step());
  }
  if (history) {
    const double worst = *std::max_element(job.max_bubble_ratios().begin(),
                                           job.max_bubble_ratios().end());
    if (measured.empty()) {
      absl::StrAppend(&out, absl::StrFormat("%.3f on the latest step's worst rank",
                                            *job.max_bubble_ratios().rbegin()));
    }
    absl::StrAppend(&out, "; worst step shown ", absl::StrFormat("%.3f", worst),
                    " (on its worst rank)");
  }
  absl::StrAppend(&out, "\n");
  return out;
}

std::string BalanceTable(const v1::Job& job) {
  if (job.balance().empty()) return "";
  const bool measured = job.balance_step() >= 0;
  const bool seconds = job.predicted_compute_in_seconds();
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "STAGES", seconds ? "PREDICTED COMPUTE" : "PREDICTED SHARE", "PREDICTED BUBBLE"}};
  if (measured) {
    rows[0].insert(rows[0].end(), {"MEASURED COMPUTE", "MEASURED BUBBLE", "SIMULATED BUBBLE"});
  }
  for (const v1::RankBalance& b : job.balance()) {
    std::vector<std::string> row = {absl::StrCat(b.rank()), absl::StrJoin(b.stages(), ","),
                                    Compute(b.predicted_compute(), seconds),
                                    absl::StrFormat("%.3f", b.predicted_bubble_ratio())};
    if (measured) {
      row.insert(row.end(), {Compute(b.measured_compute_seconds(), true),
                             absl::StrFormat("%.3f", b.measured_bubble_ratio()),
                             absl::StrFormat("%.3f", b.simulated_bubble_ratio())});
    }
    rows.push_back(std::move(row));
  }
  std::string out = FormatTable(rows);
  if (measured) {
    absl::StrAppend(&out, "(measured: global step ", job.balance_step(),
                    "; simulated: that step's measured F, B, I and W costs through the "
                    "schedule, messages free)\n");
  }
  return out;
}

nlohmann::json BalanceJson(const v1::Job& job) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const v1::RankBalance& b : job.balance()) {
    ranks.push_back({{"rank", b.rank()},
                     {"stages", std::vector<int>(b.stages().begin(), b.stages().end())},
                     {"predicted_compute", b.predicted_compute()},
                     {"predicted_bubble_ratio", b.predicted_bubble_ratio()},
                     {"measured_compute_seconds", b.measured_compute_seconds()},
                     {"measured_bubble_ratio", b.measured_bubble_ratio()},
                     {"simulated_bubble_ratio", b.simulated_bubble_ratio()}});
  }
  return {{"split", job.split()},
          {"predicted_compute_in_seconds", job.predicted_compute_in_seconds()},
          {"balance_step", job.balance_step()},
          {"ranks", ranks}};
}

}  // namespace stagecoach::client
