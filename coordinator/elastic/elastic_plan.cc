#include "coordinator/elastic/elastic_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/spec/hf_model_spec.h"
#include "common/spec/spec_overrides.h"
#include "common/util/byte_size.h"
#include "common/util/status_macros.h"

namespace stagecoach::coordinator {
namespace {

// Whether `plan`'s predicted ranks fit placement.memory_limit; the first that does not, else "".
std::string MemoryRefusal(const spec::JobSpec& spec, const Plan& plan) {
  const int64_t limit = spec.placement.memory_limit_bytes;
  if (limit <= 0) return "";
  for (size_t r = 0; r < plan.predicted_memory.size(); ++r) {
    const PredictedRankMemory& m = plan.predicted_memory[r];
    if (m.static_bytes + m.peak_bytes > limit) {
      return absl::StrCat("rank ", r, " would hold ",
                          util::FormatBytes(static_cast<double>(m.static_bytes + m.peak_bytes)),
                          ", over placement.memory_limit ",
                          util::FormatBytes(static_cast<double>(limit)));
    }
  }
  return "";
}

spec::SpecOverrides OverridesFor(const spec::JobSpec& own_spec, const Plan& own,
                                 const ElasticLayout& layout) {
  spec::SpecOverrides o;
  o.set = {{"placement.workers", absl::StrCat(layout.ranks)},
           {"placement.replicas", absl::StrCat(layout.replicas)},
           {"schedule.microbatches", absl::StrCat(layout.microbatches)},
           {"split.stages", absl::StrCat(layout.stages)}};
  o.remove = {"split.points"};
  if (spec::IsAutoSchedule(own_spec.schedule))
    o.set.emplace_back("schedule.kind", own.schedule_name);
  if (layout.replicas == 1) {
    // They mean something only with replicas (and carry_on is refused without).
    o.remove.push_back("placement.shard_optimizer");
    o.remove.push_back("placement.shard");
    o.remove.push_back("placement.unshard");
    o.remove.push_back("restart.carry_on");
  }
  return o;
}

}  // namespace

std::vector<ElasticLayout> ElasticLayouts(const Plan& own, int workers, int min_workers) {
  std::vector<ElasticLayout> out;
  const int ranks = std::max(1, own.num_ranks);
  const int replicas = std::max(1, own.replicas);
  const int per_rank = std::max(1, own.num_stages / ranks);
  const int64_t microbatches = static_cast<int64_t>(own.num_microbatches) * replicas;
  const int layers = static_cast<int>(own.layers.size());
  workers = std::min(workers, ranks * replicas - 1);
  for (int total = workers; total >= std::max(1, min_workers); --total) {
    for (int r = ranks; r >= 1; --r) {
      if (total % r != 0) continue;
      const int d = total / r;
      if (d > replicas || microbatches % d != 0 || per_rank * r > layers) continue;
      out.push_back({r, d, static_cast<int>(microbatches / d), per_rank * r});
    }
  }
  return out;
}

std::string DescribeLayout(const Plan& plan) {
  return absl::StrCat(
      plan.schedule_name, " on ", plan.num_ranks, plan.num_ranks == 1 ? " rank x " : " ranks x ",
      plan.replicas, plan.replicas == 1 ? " replica, " : " replicas, ", plan.num_stages,
      plan.num_stages == 1 ? " stage, " : " stages, ", plan.num_microbatches, " microbatches");
}

absl::StatusOr<ElasticPlan> PlanOnWorkers(const std::string& job_id, const std::string& own_yaml,
                                          const Plan& own, int workers, int min_workers) {
  absl::StatusOr<spec::JobSpec> own_spec = spec::ReadJobSpec(own_yaml, job_id);
  if (!own_spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(job_id, ": its spec no longer reads: ", own_spec.status().message()));
  }
  std::string last = "no layout of its ranks and replicas uses that many";
  for (const ElasticLayout& layout : ElasticLayouts(own, workers, min_workers)) {
    const std::string tried = absl::StrCat(layout.ranks, " ranks x ", layout.replicas, " replicas");
    absl::StatusOr<std::string> yaml =
        spec::ApplySpecOverrides(own_yaml, job_id, OverridesFor(*own_spec, own, layout));
    absl::StatusOr<spec::JobSpec> spec =
        yaml.ok() ? spec::ReadJobSpec(*yaml, job_id) : absl::StatusOr<spec::JobSpec>(yaml.status());
    if (!spec.ok()) {
      last = absl::StrCat(tried, ": ", spec.status().message());
      continue;
    }
    absl::StatusOr<Plan> plan = PlanJob(*spec, own.layers);
    if (!plan.ok()) {
      last = absl::StrCat(tried, ": ", plan.status().message());
      continue;
    }
    if (std::string refused = MemoryRefusal(*spec, *plan); !refused.empty()) {
      last = absl::StrCat(tried, ": ", refused);
      continue;
    }
    ElasticPlan out{*std::move(yaml), *std::move(spec), *std::move(plan), ""};
    out.summary = DescribeLayout(out.plan);
    return out;
  }
  return absl::FailedPreconditionError(absl::StrCat(job_id, ": cannot be planned on ", workers,
                                                    " workers (restart.min_workers ", min_workers,
                                                    "): ", last));
}

}  // namespace stagecoach::coordinator
