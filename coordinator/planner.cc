#include "coordinator/planner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/schedule/build.h"
#include "common/spec/spec_parser.h"
#include "common/util/status_macros.h"

namespace stagecoach::coordinator {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// The features of the spec language this planner can run; everything else is refused up front
// with the field that asks for it, rather than failing later on a worker.
absl::Status CheckSupported(const spec::JobSpec& spec) {
  if (spec.model.torchscript.has_value()) {
    return FieldError("model.torchscript",
                      "TorchScript models are not supported by this coordinator yet; use "
                      "model.builtin");
  }
  if (spec.model.builtin->family != "mlp") {
    return FieldError("model.builtin.family",
                      absl::StrCat("family '", spec.model.builtin->family,
                                   "' is not supported by this coordinator yet (supported: mlp)"));
  }
  if (!spec.split.points.empty()) {
    return FieldError("split.points",
                      "split points are not supported by this coordinator yet; use split.stages");
  }
  if (spec.split.policy == "profiled") {
    return FieldError("split.policy",
                      "'profiled' is not supported by this coordinator yet (supported: "
                      "equal-layers, equal-params)");
  }
  if (!spec.schedule.csv.empty()) {
    return FieldError("schedule.csv",
                      "schedules from a file are not supported by this coordinator yet; use "
                      "schedule.kind");
  }
  if (spec.placement.device != "cpu") {
    return FieldError("placement.device",
                      absl::StrCat("'", spec.placement.device,
                                   "' is not supported by this coordinator yet (supported: cpu)"));
  }
  if (!spec.placement.style.empty() && spec.placement.style != "loop") {
    return FieldError("placement.style",
                      absl::StrCat("'", spec.placement.style,
                                   "' is not supported by this coordinator yet (supported: loop)"));
  }
  if (spec.data.kind != "synthetic") {
    return FieldError("data.kind",
                      absl::StrCat("'", spec.data.kind,
                                   "' data is not supported by this coordinator yet (supported: "
                                   "synthetic)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> BuiltinLayerParameters(const spec::BuiltinModel& model) {
  std::vector<int64_t> out;
  if (model.family == "mlp") {
    for (size_t i = 0; i + 1 < model.sizes.size(); ++i) {
      out.push_back(model.sizes[i] * model.sizes[i + 1] + model.sizes[i + 1]);
    }
  }
  return out;
}

std::vector<int> PartitionBalanced(const std::vector<int64_t>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // best[k][i]: the smallest possible maximum part cost when the first i layers form k parts.
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      // The last part is layers [j, i); scanning j upwards keeps the longest last part among
      // equally good cuts, so on ties later stages take more layers and earlier ones fewer
      // (earlier stages hold more microbatches in flight under 1F1B).
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == kInf) continue;
        const int64_t cost = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (cost < best[k][i]) {
          best[k][i] = cost;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> firsts(stages);
  for (int k = stages, i = n; k >= 1; --k) {
    firsts[k - 1] = cut[k][i];
    i = cut[k][i];
  }
  return firsts;
}

absl::StatusOr<Plan> PlanJob(const spec::JobSpec& spec) {
  RETURN_IF_ERROR(CheckSupported(spec));
  Plan plan;
  auto kind = schedule::ParseScheduleKind(spec.schedule.kind);
  if (!kind.ok()) return FieldError("schedule.kind", kind.status().message());
  if (*kind != schedule::ScheduleKind::kGPipe && *kind != schedule::ScheduleKind::k1F1B) {
    // The schedule library generates every kind; the worker runtime executes one stage per
    // worker with full backwards so far.
    return FieldError("schedule.kind",
                      absl::StrCat(schedule::ScheduleKindName(*kind),
                                   " is not supported by the worker runtime yet; supported: GPipe, "
                                   "1F1B (stagectl schedule shows any schedule)"));
  }
  plan.kind = *kind;
  plan.stages_per_rank = 1;  // GPipe and 1F1B run one stage per rank
  plan.num_microbatches = spec.schedule.microbatches;

  const int64_t layers = spec::BuiltinLayerCount(*spec.model.builtin);
  const int spr = plan.stages_per_rank;
  if (spec.split.stages > 0) {
    plan.num_stages = spec.split.stages;
  } else if (spec.placement.workers > 0) {
    plan.num_stages = spec.placement.workers * spr;
  } else {
    return FieldError("split.stages", "required (or give placement.workers)");
  }
  plan.num_ranks = spec.placement.workers > 0 ? spec.placement.workers : plan.num_stages / spr;
  if (plan.num_stages != plan.num_ranks * spr) {
    return FieldError("placement.workers",
                      absl::StrCat(schedule::ScheduleKindName(plan.kind), " runs ", spr,
                                   " stage(s) per worker, so ", plan.num_stages, " stages need ",
                                   plan.num_stages / spr + (plan.num_stages % spr != 0),
                                   " workers, got ", plan.num_ranks));
  }
  if (plan.num_stages > layers) {
    return FieldError("split.stages", absl::StrCat("must be <= ", layers,
                                                   " (the model's layers; a stage needs at "
                                                   "least one), got ",
                                                   plan.num_stages));
  }

  // Partition layers into stages.
  const std::vector<int64_t> params = BuiltinLayerParameters(*spec.model.builtin);
  std::vector<int> firsts;
  if (spec.split.policy == "equal-params") {
    firsts = PartitionBalanced(params, plan.num_stages);
  } else {
    firsts = PartitionBalanced(std::vector<int64_t>(params.size(), 1), plan.num_stages);
  }
  for (int s = 0; s < plan.num_stages; ++s) {
    StagePlan st;
    st.stage = s;
    st.first_layer = firsts[s];
    st.end_layer = s + 1 < plan.num_stages ? firsts[s + 1] : static_cast<int>(layers);
    for (int l = st.first_layer; l < st.end_layer; ++l) st.parameters += params[l];
    plan.stages.push_back(st);
  }

  // Generate, lower and validate the schedule. Unsharded stages: no UNSHARD/RESHARD.
  schedule::ScheduleConfig config;
  config.kind = plan.kind;
  config.num_ranks = plan.num_ranks;
  config.stages_per_rank = spr;
  config.num_microbatches = plan.num_microbatches;
  schedule::LoweringOptions lowering;
  lowering.max_active_stages = 0;
  auto built = schedule::BuildSchedule(config, lowering);
  if (!built.ok()) {
    if (built.status().code() == absl::StatusCode::kInvalidArgument) {
      return FieldError("schedule", built.status().message());
    }
    return built.status();
  }
  plan.stage_to_rank = std::move(built->stage_to_rank);
  plan.lowered = std::move(built->lowered);
  return plan;
}
}  // namespace stagecoach::coordinator
