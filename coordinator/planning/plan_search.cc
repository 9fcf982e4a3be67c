#include "coordinator/planning/plan_search.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/generators.h"
#include "common/schedule/simulator.h"
#include "common/util/byte_size.h"
#include "common/util/status_macros.h"
#include "coordinator/planning/memory_prediction.h"
#include "coordinator/planning/planner_parts.h"

namespace stagecoach::coordinator {
namespace {

using planning::FieldError;

constexpr int kMaxSearchedMicrobatches = 64;

// One profiled quantity of a layer: how to read it and how to store it.
struct LayerField {
  std::function<double(const v1::LayerInfo&)> get;
  std::function<void(v1::LayerInfo*, double)> set;
};

const std::vector<LayerField>& ScaledFields() {
  static const auto* fields = new std::vector<LayerField>{
      {[](const v1::LayerInfo& l) { return l.forward_seconds(); },
       [](v1::LayerInfo* l, double v) { l->set_forward_seconds(v); }},
      {[](const v1::LayerInfo& l) { return l.backward_seconds(); },
       [](v1::LayerInfo* l, double v) { l->set_backward_seconds(v); }},
      {[](const v1::LayerInfo& l) { return l.backward_input_seconds(); },
       [](v1::LayerInfo* l, double v) { l->set_backward_input_seconds(v); }},
      {[](const v1::LayerInfo& l) { return l.backward_weight_seconds(); },
       [](v1::LayerInfo* l, double v) { l->set_backward_weight_seconds(v); }},
      {[](const v1::LayerInfo& l) { return static_cast<double>(l.activation_bytes()); },
       [](v1::LayerInfo* l, double v) { l->set_activation_bytes(std::llround(v)); }},
      {[](const v1::LayerInfo& l) { return static_cast<double>(l.output_bytes()); },
       [](v1::LayerInfo* l, double v) { l->set_output_bytes(std::llround(v)); }},
      {[](const v1::LayerInfo& l) { return static_cast<double>(l.backward_transient_bytes()); },
       [](v1::LayerInfo* l, double v) { l->set_backward_transient_bytes(std::llround(v)); }},
      {[](const v1::LayerInfo& l) { return static_cast<double>(l.forward_transient_bytes()); },
       [](v1::LayerInfo* l, double v) { l->set_forward_transient_bytes(std::llround(v)); }},
      {[](const v1::LayerInfo& l) { return static_cast<double>(l.weight_pending_bytes()); },
       [](v1::LayerInfo* l, double v) { l->set_weight_pending_bytes(std::llround(v)); }},
  };
  return *fields;
}

// The value at `rows` from (rows, value) points sorted by rows (see LayersForRows).
double ValueAt(const std::vector<std::pair<double, double>>& points, double rows) {
  auto scaled = [&](size_t i) {
    return points[i].first > 0 ? points[i].second * rows / points[i].first : points[i].second;
  };
  if (points.size() == 1) return scaled(0);
  size_t hi = 1;
  while (hi + 1 < points.size() && points[hi].first < rows) ++hi;
  const size_t lo = hi - 1;
  const size_t nearest =
      std::abs(points[lo].first - rows) <= std::abs(points[hi].first - rows) ? lo : hi;
  const double run = points[hi].first - points[lo].first;
  if (run <= 0) return scaled(nearest);
  const double slope = (points[hi].second - points[lo].second) / run;
  const double value = points[lo].second + slope * (rows - points[lo].first);
  if (slope < 0 || value < 0) return scaled(nearest);
  return value;
}

// Stages per worker to try for `kind` (1 for single-stage schedules, 2 for the V schedules,
// 2 to 4 for the looped multi-stage ones), or the one split.stages / split.points make.
std::vector<int> StagesPerRankFor(schedule::ScheduleKind kind, int workers, int fixed_stages) {
  const int natural = schedule::DefaultStagesPerRank(kind);
  std::vector<int> options;
  if (natural == 1) {
    options = {1};
  } else if (schedule::DefaultMappingStyle(kind) == schedule::MappingStyle::kV) {
    options = {2};
  } else {
    options = {2, 3, 4};
  }
  if (fixed_stages <= 0) return options;
  if (fixed_stages % workers != 0) return {};
  const int spr = fixed_stages / workers;
  if (natural == 1 && spr != 1) return {};
  if (schedule::DefaultMappingStyle(kind) == schedule::MappingStyle::kV && spr != 2) return {};
  return {spr};
}

std::vector<schedule::ScheduleKind> KindsFor(const spec::JobSpec& spec) {
  if (!spec::IsAutoSchedule(spec.schedule)) {
    return {*schedule::ParseScheduleKind(spec.schedule.kind)};
  }
  std::vector<schedule::ScheduleKind> kinds;
  for (schedule::ScheduleKind kind : schedule::AllScheduleKinds()) {
    if (schedule::HasBackward(kind)) kinds.push_back(kind);
  }
  return kinds;
}

// The candidate `plan` makes, simulated with `costs`; fits against `limit` (0: none).
absl::StatusOr<v1::PlanCandidate> Describe(const Plan& plan, const std::string& policy,
                                           const CostAssumptions& costs, int64_t limit) {
  v1::PlanCandidate c;
  c.set_schedule(plan.schedule_name);
  c.set_stages_per_rank(plan.stages_per_rank);
  c.set_num_stages(plan.num_stages);
  c.set_microbatches(plan.num_microbatches);
  c.set_split_policy(policy);
  for (const StagePlan& stage : plan.stages) c.add_stage_first_layers(stage.first_layer);
  auto sim = schedule::Simulate(plan.lowered, plan.stage_to_rank, plan.num_stages,
                                plan.num_microbatches, PlanCostModel(plan, costs));
  if (!sim.ok()) {
    return absl::InternalError(
        absl::StrCat("simulating ", DescribeCandidate(c), " failed: ", sim.status().message()));
  }
  c.set_step_seconds(sim->makespan);
  double bubble = 0;
  for (double b : sim->bubble_ratio) bubble += b;
  if (!sim->bubble_ratio.empty()) bubble /= static_cast<double>(sim->bubble_ratio.size());
  c.set_bubble(bubble);
  for (size_t r = 0; r < sim->busy.size(); ++r) {
    c.add_rank_compute_seconds(sim->busy[r]);
    c.add_rank_bubble_ratios(sim->bubble_ratio[r]);
  }
  int64_t largest = 0;
  for (const PredictedRankMemory& rank : plan.predicted_memory) {
    c.add_rank_peak_bytes(rank.static_bytes + rank.peak_bytes);
    largest = std::max(largest, rank.static_bytes + rank.peak_bytes);
  }
  c.set_max_peak_bytes(largest);
  c.set_fits(limit <= 0 || largest <= limit);
  return c;
}

// The shard levels a candidate tries, in order: every level with placement.shard: auto and
// replicas, else the spec's own.
std::vector<spec::ShardLevel> LevelsFor(const spec::JobSpec& spec) {
  if (!spec.placement.shard_auto) return {spec.placement.shard};
  if (spec.placement.replicas <= 1) return {spec::ShardLevel::kNone};
  return {spec::ShardLevel::kNone, spec::ShardLevel::kOptimizer, spec::ShardLevel::kGradients,
          spec::ShardLevel::kParameters};
}

// `candidate` (schedule, stages, microbatches and split set) planned on `layers` and described
// at each of `levels` in order: the first that fits `limit`, else the one with the smallest
// peak. With shard: auto the candidate names its level. PlanJob's errors.
absl::StatusOr<v1::PlanCandidate> PlanAtLevels(spec::JobSpec candidate,
                                               const std::vector<v1::LayerInfo>& layers,
                                               const std::string& policy,
                                               const std::vector<spec::ShardLevel>& levels,
                                               const SearchOptions& options, int64_t limit) {
  std::optional<v1::PlanCandidate> best;
  for (spec::ShardLevel level : levels) {
    candidate.placement.shard = level;
    ASSIGN_OR_RETURN(const Plan plan, PlanJob(candidate, layers, options.planning));
    ASSIGN_OR_RETURN(v1::PlanCandidate c, Describe(plan, policy, options.costs, limit));
    if (candidate.placement.shard_auto) c.set_shard(spec::ShardLevelName(level));
    if (c.fits()) return c;
    if (!best.has_value() || c.max_peak_bytes() < best->max_peak_bytes()) best = std::move(c);
  }
  return *std::move(best);
}

std::string CandidateKey(const v1::PlanCandidate& c) {
  return absl::StrCat(c.schedule(), "/", c.stages_per_rank(), "/", c.microbatches(), "/",
                      absl::StrJoin(c.stage_first_layers(), ","));
}

// What SearchPlans refuses before it plans anything (see plan_search.h).
absl::Status CheckSearchable(const spec::JobSpec& spec, const std::vector<LayerProfile>& profiles) {
  if (spec.placement.workers <= 0) {
    return FieldError("placement.workers",
                      "required to search plans (the search chooses how the workers are used: "
                      "schedule, stages per worker, microbatches and split, not how many)");
  }
  if (!spec.schedule.csv.empty()) {
    return FieldError("schedule.csv",
                      "a schedule file is one plan already; plans are searched for "
                      "schedule.kind auto or a named schedule");
  }
  if (!spec::IsAutoSchedule(spec.schedule)) {
    auto kind = schedule::ParseScheduleKind(spec.schedule.kind);
    if (!kind.ok()) return FieldError("schedule.kind", kind.status().message());
    if (!schedule::HasBackward(*kind)) {
      return FieldError("schedule.kind", "plans are searched for training schedules only");
    }
  }
  if (profiles.empty() || profiles.front().layers.empty()) {
    return absl::InvalidArgumentError("plan search: the model's profiled layers are missing");
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<v1::LayerInfo> LayersForRows(const std::vector<LayerProfile>& profiles, int64_t rows) {
  std::vector<const LayerProfile*> sorted;
  for (const LayerProfile& p : profiles) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(),
            [](const LayerProfile* a, const LayerProfile* b) { return a->rows < b->rows; });
  std::vector<v1::LayerInfo> out = profiles.front().layers;
  for (size_t l = 0; l < out.size(); ++l) {
    for (const LayerField& field : ScaledFields()) {
      std::vector<std::pair<double, double>> points;
      for (const LayerProfile* p : sorted) {
        if (l < p->layers.size()) {
          points.emplace_back(static_cast<double>(p->rows), field.get(p->layers[l]));
        }
      }
      if (!points.empty()) field.set(&out[l], ValueAt(points, static_cast<double>(rows)));
    }
  }
  return out;
}

std::vector<int> SearchMicrobatchCounts(const spec::JobSpec& spec) {
  if (spec.schedule.microbatches_given) return {spec.schedule.microbatches};
  const int64_t rows = spec.training.batch_size / std::max(1, spec.placement.replicas);
  const int workers = std::max(1, spec.placement.workers);
  const int64_t most = std::min<int64_t>(8LL * workers, kMaxSearchedMicrobatches);
  std::vector<int> counts;
  int64_t below = 1;
  for (int64_t m = 1; m <= std::min(rows, most); ++m) {
    if (rows % m != 0) continue;
    if (m >= workers) {
      counts.push_back(static_cast<int>(m));
    } else {
      below = m;
    }
  }
  if (counts.empty()) counts.push_back(static_cast<int>(below));
  return counts;
}

std::vector<std::string> SearchSplitPolicies(const spec::JobSpec& spec) {
  if (!spec.split.points.empty()) return {"points"};
  if (spec.split.policy_given) return {spec.split.policy};
  return {"equal-layers", "equal-params", "profiled", "memory", "fewer-first-last"};
}

absl::StatusOr<SearchResult> SearchPlans(const spec::JobSpec& spec,
                                         const std::vector<LayerProfile>& profiles,
                                         const SearchOptions& options) {
  RETURN_IF_ERROR(CheckSearchable(spec, profiles));
  const int workers = spec.placement.workers;
  SearchResult result;
  result.memory_limit_bytes = options.memory_limit_bytes > 0 ? options.memory_limit_bytes
                                                             : spec.placement.memory_limit_bytes;
  if (result.memory_limit_bytes > 0 && !HasMeasuredSizes(profiles.front().layers)) {
    return FieldError("placement.memory_limit",
                      "the model's profile carries no measured sizes to predict memory from (a CPU "
                      "worker measures them; CUDA profiles do not yet)");
  }
  const int layers = static_cast<int>(profiles.front().layers.size());
  const int fixed_stages = !spec.split.points.empty()
                               ? static_cast<int>(spec.split.points.size()) + 1
                               : spec.split.stages;
  const int64_t replica_rows = spec.training.batch_size / std::max(1, spec.placement.replicas);
  absl::Status last_refusal = absl::OkStatus();
  std::set<std::string> seen;
  for (schedule::ScheduleKind kind : KindsFor(spec)) {
    for (int spr : StagesPerRankFor(kind, workers, fixed_stages)) {
      if (workers * spr > layers) continue;
      for (int m : SearchMicrobatchCounts(spec)) {
        const int64_t rows = (replica_rows + m - 1) / m;
        const std::vector<v1::LayerInfo> scaled = LayersForRows(profiles, rows);
        for (const std::string& policy : SearchSplitPolicies(spec)) {
          RETURN_IF_ERROR(options.planning.Interrupted("searching plans"));
          spec::JobSpec candidate = spec;
          candidate.schedule.kind = std::string(schedule::ScheduleKindName(kind));
          candidate.schedule.microbatches = m;
          candidate.schedule.microbatches_given = true;
          if (policy != "points") {
            candidate.split.stages = workers * spr;
            candidate.split.policy = policy;
            candidate.split.policy_given = true;
          }
          absl::StatusOr<v1::PlanCandidate> c = PlanAtLevels(
              candidate, scaled, policy, LevelsFor(spec), options, result.memory_limit_bytes);
          if (!c.ok()) {
            if (!absl::IsInvalidArgument(c.status())) return c.status();
            last_refusal = c.status();
            continue;
          }
          if (!seen.insert(CandidateKey(*c)).second) continue;
          result.candidates.push_back(*std::move(c));
        }
      }
    }
  }
  if (result.candidates.empty()) {
    return FieldError(
        "schedule.kind",
        absl::StrCat("no plan could be made for ", workers, " workers and ", layers, " layers",
                     last_refusal.ok()
                         ? std::string()
                         : absl::StrCat(" (the last refused: ", last_refusal.message(), ")")));
  }
  std::stable_sort(result.candidates.begin(), result.candidates.end(),
                   [](const v1::PlanCandidate& a, const v1::PlanCandidate& b) {
                     if (a.fits() != b.fits()) return a.fits();
                     if (a.step_seconds() != b.step_seconds()) {
                       return a.step_seconds() < b.step_seconds();
                     }
                     return a.max_peak_bytes() < b.max_peak_bytes();
                   });
  for (const v1::PlanCandidate& c : result.candidates) result.fitting += c.fits() ? 1 : 0;
  return result;
}

spec::SpecOverrides CandidateOverrides(const v1::PlanCandidate& candidate) {
  spec::SpecOverrides o;
  o.set = {{"schedule.kind", candidate.schedule()},
           {"schedule.microbatches", absl::StrCat(candidate.microbatches())}};
  if (candidate.split_policy() != "points") {
    o.set.push_back({"split.stages", absl::StrCat(candidate.num_stages())});
    o.set.push_back({"split.policy", candidate.split_policy()});
  }
  if (!candidate.shard().empty()) {  // chosen for placement.shard: auto
    o.set.push_back({"placement.shard", candidate.shard()});
    if (candidate.shard() != "parameters") o.remove.push_back("placement.unshard");
  }
  return o;
}

absl::StatusOr<v1::PlanChoice> ChoosePlan(const SearchResult& result) {
  v1::PlanChoice choice;
  choice.set_candidates(static_cast<int>(result.candidates.size()));
  choice.set_fitting(result.fitting);
  choice.set_memory_limit_bytes(result.memory_limit_bytes);
  if (result.fitting == 0) {
    const v1::PlanCandidate* smallest = nullptr;
    for (const v1::PlanCandidate& c : result.candidates) {
      if (smallest == nullptr || c.max_peak_bytes() < smallest->max_peak_bytes()) smallest = &c;
    }
    return FieldError(
        "placement.memory_limit",
        absl::StrCat("no plan fits ", util::FormatBytes(result.memory_limit_bytes),
                     " per worker: the smallest predicted peak of the ", result.candidates.size(),
                     " plans searched is ",
                     smallest ? util::FormatBytes(smallest->max_peak_bytes()) : "unknown",
                     smallest ? absl::StrCat(" (", DescribeCandidate(*smallest), ")") : "",
                     "; raise the limit, add workers, or set "
                     "training.activation_checkpointing: full"));
  }
  *choice.mutable_chosen() = result.candidates[0];
  if (result.fitting > 1) *choice.mutable_runner_up() = result.candidates[1];
  return choice;
}

std::string DescribeCandidate(const v1::PlanCandidate& c) {
  return absl::StrCat(c.schedule(), ", ", c.stages_per_rank(), " stage",
                      c.stages_per_rank() == 1 ? "" : "s", "/worker, ", c.microbatches(),
                      " microbatches, split ", c.split_policy(),
                      c.shard().empty() ? "" : absl::StrCat(", shard ", c.shard()));
}

}  // namespace stagecoach::coordinator
