#include "client/render/render_plan.h"

#include <algorithm>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/byte_size.h"

namespace stagecoach::client {
namespace {

std::string Seconds(double s) {
  return s >= 1 ? absl::StrFormat("%.3f s", s) : absl::StrFormat("%.2f ms", s * 1e3);
}

// "ZBVZeroBubble, 2 stages/worker, 16 microbatches, split memory: step 12.3 ms, bubble 4.1%,
// peak 1.2 GiB".
std::string Summary(const v1::PlanCandidate& c) {
  return absl::StrCat(
      c.schedule(), ", ", c.stages_per_rank(), " stage", c.stages_per_rank() == 1 ? "" : "s",
      "/worker, ", c.microbatches(), " microbatches, split ", c.split_policy(),
      c.shard().empty() ? "" : absl::StrCat(", shard ", c.shard()), ": step ",
      Seconds(c.step_seconds()), ", bubble ", absl::StrFormat("%.1f%%", 100 * c.bubble()),
      ", peak ", c.max_peak_bytes() > 0 ? util::FormatBytes(c.max_peak_bytes()) : "unknown");
}

}  // namespace

std::string PlanTable(const v1::PlanSpecResponse& plans, int top) {
  std::ostringstream out;
  int fitting = 0;
  for (const v1::PlanCandidate& c : plans.candidates()) fitting += c.fits() ? 1 : 0;
  out << plans.candidates_size() << " plans searched";
  if (plans.memory_limit_bytes() > 0) {
    out << ", " << fitting << " fit " << util::FormatBytes(plans.memory_limit_bytes())
        << " per worker";
  }
  if (!plans.profiled_by().empty()) {
    out << " (" << plans.layers_size() << " layers profiled by " << plans.profiled_by() << ")";
  }
  out << "\n";
  // A SHARD column when the search chose the shard level (placement.shard: auto).
  const bool shards = std::any_of(plans.candidates().begin(), plans.candidates().end(),
                                  [](const v1::PlanCandidate& c) { return !c.shard().empty(); });
  auto shard = [&](const std::string& value) {
    return shards ? absl::StrFormat("%-11s ", value) : std::string();
  };
  out << absl::StrFormat("%-4s %-22s %-8s %-6s %-16s %s%-11s %-7s %-11s %s\n", "RANK", "SCHEDULE",
                         "STAGES/W", "MB", "SPLIT", shard("SHARD"), "STEP", "BUBBLE", "PEAK",
                         "FITS");
  const int shown = std::min(top, plans.candidates_size());
  for (int i = 0; i < shown; ++i) {
    const v1::PlanCandidate& c = plans.candidates(i);
    out << absl::StrFormat("%-4d %-22s %-8d %-6d %-16s %s%-11s %-7s %-11s %s\n", i + 1,
                           c.schedule(), c.stages_per_rank(), c.microbatches(), c.split_policy(),
                           shard(c.shard()), Seconds(c.step_seconds()),
                           absl::StrFormat("%.1f%%", 100 * c.bubble()),
                           c.max_peak_bytes() > 0 ? util::FormatBytes(c.max_peak_bytes()) : "-",
                           c.fits() ? "yes" : "no");
  }
  if (shown < plans.candidates_size()) {
    out << "(" << plans.candidates_size() - shown << " more: --top N or -o json lists them)\n";
  }
  if (shown > 0 && plans.candidates(0).rank_compute_seconds_size() > 0) {
    const v1::PlanCandidate& c = plans.candidates(0);
    out << "Plan 1 per rank (predicted compute, bubble):";
    for (int r = 0; r < c.rank_compute_seconds_size(); ++r) {
      out << (r == 0 ? " " : "; ") << "rank " << r << " " << Seconds(c.rank_compute_seconds(r))
          << ", "
          << absl::StrFormat("%.3f",
                             r < c.rank_bubble_ratios_size() ? c.rank_bubble_ratios(r) : 0.0);
    }
    out << "\n";
  }
  return out.str();
}

nlohmann::json CandidateJson(const v1::PlanCandidate& c) {
  return {{"schedule", c.schedule()},
          {"stages_per_rank", c.stages_per_rank()},
          {"num_stages", c.num_stages()},
          {"microbatches", c.microbatches()},
          {"split_policy", c.split_policy()},
          {"shard", c.shard()},
          {"step_seconds", c.step_seconds()},
          {"bubble", c.bubble()},
          {"rank_peak_bytes",
           std::vector<int64_t>(c.rank_peak_bytes().begin(), c.rank_peak_bytes().end())},
          {"max_peak_bytes", c.max_peak_bytes()},
          {"fits", c.fits()},
          {"stage_first_layers",
           std::vector<int>(c.stage_first_layers().begin(), c.stage_first_layers().end())},
          {"rank_compute_seconds",
           std::vector<double>(c.rank_compute_seconds().begin(), c.rank_compute_seconds().end())},
          {"rank_bubble_ratios",
           std::vector<double>(c.rank_bubble_ratios().begin(), c.rank_bubble_ratios().end())}};
}

nlohmann::json PlanJson(const v1::PlanSpecResponse& plans) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const v1::PlanCandidate& c : plans.candidates()) candidates.push_back(CandidateJson(c));
  nlohmann::json layers = nlohmann::json::array();
  for (const v1::LayerInfo& l : plans.layers()) {
    layers.push_back({{"name", l.name()},
                      {"parameters", l.parameters()},
                      {"forward_seconds", l.forward_seconds()},
                      {"backward_seconds", l.backward_seconds()},
                      {"backward_input_seconds", l.backward_input_seconds()},
                      {"backward_weight_seconds", l.backward_weight_seconds()},
                      {"activation_bytes", l.activation_bytes()},
                      {"output_bytes", l.output_bytes()},
                      {"weight_pending_bytes", l.weight_pending_bytes()}});
  }
  return {{"memory_limit_bytes", plans.memory_limit_bytes()},
          {"profiled_by", plans.profiled_by()},
          {"candidates", candidates},
          {"layers", layers}};
}

std::string PlanChoiceText(const v1::Job& job) {
  if (!job.has_plan_choice()) return "";
  const v1::PlanChoice& p = job.plan_choice();
  std::string out = absl::StrCat(
      "Plan:      chosen by a search of ", p.candidates(), " plans (", p.fitting(), " fit",
      p.memory_limit_bytes() > 0 ? absl::StrCat(" ", util::FormatBytes(p.memory_limit_bytes()))
                                 : std::string(),
      "): ", Summary(p.chosen()), "\n");
  if (p.has_runner_up()) absl::StrAppend(&out, "Runner-up: ", Summary(p.runner_up()), "\n");
  return out;
}

nlohmann::json PlanChoiceJson(const v1::Job& job) {
  if (!job.has_plan_choice()) return nullptr;
  const v1::PlanChoice& p = job.plan_choice();
  return {{"chosen", CandidateJson(p.chosen())},
          {"runner_up", p.has_runner_up() ? CandidateJson(p.runner_up()) : nlohmann::json()},
          {"candidates", p.candidates()},
          {"fitting", p.fitting()},
          {"memory_limit_bytes", p.memory_limit_bytes()}};
}

}  // namespace stagecoach::client
