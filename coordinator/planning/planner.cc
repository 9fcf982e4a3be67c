#include "coordinator/planning/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/build.h"
#include "common/spec/builtin_model.h"
#include "common/spec/spec_limits.h"
#include "common/spec/spec_parser.h"
#include "common/transport/backends.h"
#include "common/util/status_macros.h"
#include "coordinator/planning/memory_partition.h"
#include "coordinator/planning/memory_prediction.h"
#include "coordinator/planning/plan_costs.h"
#include "coordinator/planning/planner_parts.h"
#include "coordinator/planning/split_policies.h"

namespace stagecoach::coordinator {
namespace planning {

absl::Status FieldError(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

int UnshardWindowOf(const spec::JobSpec& spec, int num_stages) {
  if (!spec::ShardsParameters(spec)) return 0;
  return schedule::UnshardWindow(spec.placement.unshard, num_stages);
}

std::vector<StagePlan> StagesFor(const std::vector<int>& firsts,
                                 const std::vector<v1::LayerInfo>& layers) {
  std::vector<StagePlan> stages;
  const int n = static_cast<int>(firsts.size());
  for (int s = 0; s < n; ++s) {
    StagePlan st;
    st.stage = s;
    st.first_layer = firsts[s];
    st.end_layer = s + 1 < n ? firsts[s + 1] : static_cast<int>(layers.size());
    for (int l = st.first_layer; l < st.end_layer; ++l) st.parameters += layers[l].parameters();
    stages.push_back(st);
  }
  return stages;
}

}  // namespace planning
namespace {

using planning::CheckStyle;
using planning::FieldError;
using planning::PlanFileSchedule;
using planning::StageRequest;

// The features of the spec language this planner can run; everything else is refused up front
// with the field that asks for it, rather than failing later on a worker.
absl::Status CheckSupported(const spec::JobSpec& spec, const PlanOptions& options) {
  if (options.client_batches) {
    if (spec.model.builtin.has_value() && spec::BuiltinLayerCount(*spec.model.builtin) == 0) {
      return FieldError("model.builtin.family",
                        absl::StrCat("family '", spec.model.builtin->family,
                                     "' is not supported by this coordinator (supported: mlp, "
                                     "gpt, llama)"));
    }
    return absl::OkStatus();
  }
  const std::string& kind = spec.data.kind;
  if (kind != "synthetic" && kind != "tokens" && kind != "jsonl" && kind != "tensors") {
    return FieldError("data.kind",
                      absl::StrCat("'", kind,
                                   "' data is not supported by this coordinator (supported: "
                                   "synthetic or tensors for mlp, tokens, jsonl or synthetic for "
                                   "gpt and llama, tensors, tokens or jsonl for a TorchScript "
                                   "model)"));
  }

  if (spec.model.torchscript.has_value()) {
    // Synthetic data is drawn for a built-in model's sizes, which a TorchScript model does not
    // declare; a tensors file carries its own shapes, a tokens file needs the window length.
    if (kind == "synthetic") {
      return FieldError("data.kind",
                        "'synthetic' data is drawn for a built-in model's sizes and cannot feed a "
                        "TorchScript model (use data.kind tensors or tokens)");
    }
    if (spec::IsTokenData(spec.data) && spec.data.seq <= 0) {
      return FieldError("data.seq",
                        absl::StrCat("required for data.kind ", kind,
                                     " with a TorchScript model (the tokens per row the model "
                                     "takes)"));
    }
  } else {
    const std::string& family = spec.model.builtin->family;
    const bool decoder = spec::IsDecoder(*spec.model.builtin);
    if (family != "mlp" && !decoder) {
      return FieldError("model.builtin.family",
                        absl::StrCat("family '", family,
                                     "' is not supported by this coordinator (supported: mlp, "
                                     "gpt, llama)"));
    }
    // Synthetic data is drawn for the model's sizes; a tensors file (torch.save'd inputs and
    // targets) feeds an MLP, a tokens file feeds a decoder.
    const bool fits =
        kind == "synthetic" || (decoder ? spec::IsTokenData(spec.data) : kind == "tensors");
    if (!fits) {
      return FieldError(
          "data.kind",
          absl::StrCat("'", kind, "' data cannot feed a ", family, " model (use data.kind ",
                       decoder ? "tokens, jsonl or synthetic" : "synthetic or tensors", ")"));
    }
    if (spec.data.seq > 0 && (!decoder || spec.data.seq != spec.model.builtin->seq)) {
      return FieldError("data.seq", decoder
                                        ? absl::StrCat("must equal model.builtin.seq (",
                                                       spec.model.builtin->seq, ") or be left out")
                                        : std::string("only used with a decoder (gpt, llama) or "
                                                      "TorchScript model"));
    }
    if (decoder && spec.training.loss != "cross_entropy") {
      return FieldError("training.loss",
                        absl::StrCat("'", spec.training.loss, "' cannot train a ", family,
                                     " model (its targets are next tokens; use cross_entropy)"));
    }
  }
  if ((kind == "tokens" || kind == "jsonl" || kind == "tensors") && spec.data.path.empty()) {
    return FieldError("data.path", absl::StrCat("required for data.kind ", kind));
  }
  return absl::OkStatus();
}

// The field that names the model in errors: model.torchscript or model.builtin.
std::string ModelField(const spec::JobSpec& spec) {
  return spec.model.torchscript.has_value() ? "model.torchscript" : "model.builtin";
}

// "a, b, c" for the layers' names; a long list keeps its first 40 and last 10 names.
std::string DescribeLayers(const std::vector<v1::LayerInfo>& layers) {
  constexpr size_t kHead = 40, kTail = 10;
  std::vector<std::string> shown;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers.size() > kHead + kTail + 1 && i == kHead) {
      shown.push_back(absl::StrCat("... (", layers.size() - kHead - kTail, " more)"));
      i = layers.size() - kTail;
    }
    shown.push_back(layers[i].name());
  }
  return absl::StrJoin(shown, ", ");
}

// placement.transport checked against the registered backends' capabilities, "auto" resolved
// to the backend the registry picks for placement.device (common/transport/backends.h).
absl::StatusOr<std::string> ResolveTransport(const spec::PlacementSpec& placement) {
  absl::StatusOr<std::string> resolved =
      transport::BackendRegistry::Global().Resolve(placement.transport, placement.device);
  if (!resolved.ok()) return FieldError("placement.transport", resolved.status().message());
  return resolved;
}

// "0, 3" for the stages `stage_to_rank` puts on `rank`.
std::string StagesOf(const std::vector<int>& stage_to_rank, int rank) {
  std::vector<int> stages;
  for (size_t s = 0; s < stage_to_rank.size(); ++s) {
    if (stage_to_rank[s] == rank) stages.push_back(static_cast<int>(s));
  }
  return absl::StrJoin(stages, ", ");
}

// The mapping style ("loop", "v") that gives `stage_to_rank`, or "" if neither does. With one
// stage per rank both do; "loop" is returned.
std::string StyleOf(const std::vector<int>& stage_to_rank, int num_ranks) {
  for (schedule::MappingStyle style : {schedule::MappingStyle::kLoop, schedule::MappingStyle::kV}) {
    auto mapping = schedule::StageToRank(static_cast<int>(stage_to_rank.size()), num_ranks, style);
    if (mapping.ok() && *mapping == stage_to_rank) {
      return std::string(schedule::MappingStyleName(style));
    }
  }
  return "";
}

}  // namespace

namespace planning {

// Checks placement.style, when given, against `stage_to_rank`, the placement the action lists
// run (a generator's lists are written for one placement; a file's rows say where each stage
// runs). `lists` names the lists ("ZBVZeroBubble's action lists", "the rows of 'my.csv'"); `row`
// says where a rank's list is ("" or " (line 2)").
absl::Status CheckStyle(const spec::PlacementSpec& placement, const std::vector<int>& stage_to_rank,
                        int num_ranks, absl::string_view lists,
                        const std::function<std::string(int)>& row) {
  if (placement.style.empty()) return absl::OkStatus();
  auto style = schedule::ParseMappingStyle(placement.style);
  if (!style.ok()) return FieldError("placement.style", style.status().message());
  auto wanted = schedule::StageToRank(static_cast<int>(stage_to_rank.size()), num_ranks, *style);
  if (!wanted.ok()) return FieldError("placement.style", wanted.status().message());
  for (size_t s = 0; s < stage_to_rank.size(); ++s) {
    if ((*wanted)[s] == stage_to_rank[s]) continue;
    const int actual = stage_to_rank[s];
    const std::string lists_style = StyleOf(stage_to_rank, num_ranks);
    return FieldError(
        "placement.style",
        absl::StrCat("'", placement.style, "' places stage ", s, " on rank ", (*wanted)[s],
                     ", but ", lists, " run it on rank ", actual, row(actual),
                     ", which runs stages ", StagesOf(stage_to_rank, actual), " (",
                     lists_style.empty() ? "neither loop nor v placement"
                                         : absl::StrCat(lists_style, " placement"),
                     "); leave placement.style out",
                     lists_style.empty() ? "" : absl::StrCat(" or set it to ", lists_style)));
  }
  return absl::OkStatus();
}

}  // namespace planning
namespace {

absl::Status CheckStagesFitLayers(int stages, int64_t layers, const StageRequest& request) {
  if (stages <= layers) return absl::OkStatus();
  return FieldError(request.field, absl::StrCat("must be <= ", layers,
                                                " (the model's layers; a stage needs at least "
                                                "one), got ",
                                                stages));
}

// schedule.kind: stage and worker counts, then the generator's lists, placed, lowered and
// validated.
int64_t ActionCount(const schedule::PipelineOrder& order) {
  int64_t n = 0;
  for (const auto& rank : order) n += static_cast<int64_t>(rank.size());
  return n;
}

// The stages and actions a generated schedule would have, within `limits`: refused before the
// schedule is built (every stage runs at most F, B or I and W, and their sends and receives, for
// each microbatch: at most 8 actions per stage and microbatch over all ranks).
absl::Status CheckScheduleSize(const Plan& plan, const StageRequest& request,
                               const spec::SpecLimits& limits) {
  if (plan.num_stages > limits.max_stages) {
    return FieldError(request.field,
                      absl::StrCat(plan.num_stages, " stages are over the limit of ",
                                   limits.max_stages, " stages (the coordinator's --max-stages)"));
  }
  const int64_t actions = 8 * static_cast<int64_t>(plan.num_stages) * plan.num_microbatches;
  if (actions > limits.max_actions) {
    return FieldError(
        "schedule.microbatches",
        absl::StrCat(plan.num_stages, " stages x ", plan.num_microbatches,
                     " microbatches make up to ", actions, " schedule actions, over the limit of ",
                     limits.max_actions, " (the coordinator's --max-actions)"));
  }
  return absl::OkStatus();
}

absl::Status PlanGeneratedSchedule(const spec::JobSpec& spec, const StageRequest& request,
                                   int64_t layers, const spec::SpecLimits& limits, Plan* plan) {
  if (spec::IsAutoSchedule(spec.schedule)) {
    return FieldError("schedule.kind",
                      "'auto' is a search over plans (the coordinator's plan search chooses the "
                      "schedule before planning), not a schedule to plan");
  }
  auto kind = schedule::ParseScheduleKind(spec.schedule.kind);
  if (!kind.ok()) return FieldError("schedule.kind", kind.status().message());
  plan->kind = *kind;
  const absl::string_view name = schedule::ScheduleKindName(*kind);
  plan->schedule_name = std::string(name);
  plan->has_backward = schedule::HasBackward(*kind);
  if (!plan->has_backward && spec.eval.has_value()) {
    return FieldError("eval", absl::StrCat("schedule ", name,
                                           " runs no training steps to validate; remove eval"));
  }

  const int default_spr = schedule::DefaultStagesPerRank(*kind);
  const int stages = request.stages;
  const int workers = spec.placement.workers;
  if (stages > 0 && workers > 0) {
    if (stages % workers != 0) {
      return FieldError(
          "placement.workers",
          absl::StrCat(stages, " stages do not divide evenly among ", workers, " workers (",
                       request.from_points() ? "the stages split.points make" : "split.stages",
                       " must be a multiple of placement.workers)"));
    }
    plan->num_stages = stages;
    plan->num_ranks = workers;
  } else if (stages > 0) {
    if (stages % default_spr != 0) {
      return FieldError(
          request.field,
          absl::StrCat(name, " runs ", default_spr,
                       " stages per worker unless placement.workers says otherwise, "
                       "and ",
                       stages, request.from_points() ? " (the stages split.points make)" : "",
                       " is not a multiple of ", default_spr, "; give placement.workers"));
    }
    plan->num_stages = stages;
    plan->num_ranks = stages / default_spr;
  } else if (workers > 0) {
    plan->num_stages = workers * default_spr;
    plan->num_ranks = workers;
  } else {
    return FieldError("split.stages", "required (or give placement.workers)");
  }
  plan->stages_per_rank = plan->num_stages / plan->num_ranks;
  RETURN_IF_ERROR(CheckStagesFitLayers(plan->num_stages, layers, request));
  RETURN_IF_ERROR(CheckScheduleSize(*plan, request, limits));

  // Generate, lower and validate. UNSHARD/RESHARD only where the stages' parameters are sharded.
  schedule::ScheduleConfig config;
  config.kind = plan->kind;
  config.num_ranks = plan->num_ranks;
  config.stages_per_rank = plan->stages_per_rank;
  config.num_microbatches = plan->num_microbatches;
  schedule::LoweringOptions lowering;
  lowering.max_active_stages = planning::UnshardWindowOf(spec, plan->num_stages);
  auto built = schedule::BuildSchedule(config, lowering);
  if (!built.ok()) {
    if (built.status().code() != absl::StatusCode::kInvalidArgument) return built.status();
    return FieldError(
        "schedule.kind",
        absl::StrCat(name, " with ", plan->num_stages, " stages on ", plan->num_ranks,
                     plan->num_ranks == 1 ? " worker (" : " workers (", plan->stages_per_rank,
                     " per worker) and ", plan->num_microbatches,
                     " microbatches: ", built.status().message()));
  }
  // The lists are written for the kind's own placement; placement.style may only restate it
  // (with one stage per worker loop and v are the same placement).
  RETURN_IF_ERROR(CheckStyle(spec.placement, built->stage_to_rank, plan->num_ranks,
                             absl::StrCat(name, "'s action lists"),
                             [](int) { return std::string(); }));
  plan->stage_to_rank = std::move(built->stage_to_rank);
  plan->lowered = std::move(built->lowered);
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> BuiltinLayerParameters(const spec::BuiltinModel& model) {
  // Admission refuses a model whose counts overflow (spec::CheckSpecLimits).
  absl::StatusOr<std::vector<int64_t>> counts = spec::BuiltinLayerParameterCounts(model);
  return counts.ok() ? *std::move(counts) : std::vector<int64_t>{};
}

bool NeedsInspection(const spec::JobSpec& spec) {
  return spec.model.torchscript.has_value() || NeedsProfile(spec);
}

bool NeedsProfile(const spec::JobSpec& spec) {
  const bool policy_measures = spec.split.policy == "profiled" || spec.split.policy == "memory";
  return (spec.split.points.empty() && policy_measures) || spec::IsAutoSchedule(spec.schedule) ||
         spec.placement.memory_limit_bytes > 0;
}

absl::Status CheckPlannable(const spec::JobSpec& spec, const PlanOptions& options) {
  return CheckSupported(spec, options);
}

std::vector<v1::LayerInfo> BuiltinLayers(const spec::BuiltinModel& model) {
  const std::vector<std::string> names = spec::BuiltinLayerNames(model);
  const std::vector<int64_t> params = BuiltinLayerParameters(model);
  std::vector<v1::LayerInfo> out(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    out[i].set_name(names[i]);
    if (i < params.size()) out[i].set_parameters(params[i]);
  }
  return out;
}

namespace {

// The layers a split point names: the layer itself, or the contiguous run of layers inside a
// module whose calls the worker opened (torchscript_model.h, "Nested layers").
struct LayerRun {
  int first = 0;
  int last = 0;
};

absl::StatusOr<LayerRun> LayersOf(const std::string& name, const std::map<std::string, int>& index,
                                  const std::vector<v1::LayerInfo>& layers) {
  auto found = index.find(name);
  if (found != index.end()) return LayerRun{found->second, found->second};
  std::vector<int> inside;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (absl::StartsWith(layers[i].name(), absl::StrCat(name, "."))) {
      inside.push_back(static_cast<int>(i));
    }
  }
  if (inside.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a layer of the model (its ",
                                                   layers.size(),
                                                   " layers: ", DescribeLayers(layers), ")"));
  }
  for (size_t k = 1; k < inside.size(); ++k) {
    if (inside[k] != inside[k - 1] + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the layers inside '", name, "' are not contiguous (layer ",
          layers[inside[k - 1] + 1].name(), " comes between ", layers[inside[k - 1]].name(),
          " and ", layers[inside[k]].name(), "), so no single boundary is at its ",
          "beginning or end; name one of its layers"));
    }
  }
  return LayerRun{inside.front(), inside.back()};
}

}  // namespace

absl::StatusOr<std::vector<int>> SplitPointsToFirstLayers(
    const std::map<std::string, std::string>& points, const std::vector<v1::LayerInfo>& layers) {
  std::map<std::string, int> index;
  for (size_t i = 0; i < layers.size(); ++i) index.emplace(layers[i].name(), static_cast<int>(i));
  const int n = static_cast<int>(layers.size());
  // Boundary b is "stage starts at layer b"; the point that made it, for errors.
  std::map<int, std::string> boundaries;
  for (const auto& [name, where] : points) {
    const std::string field = absl::StrCat("split.points.", name);
    if (where != "beginning" && where != "end") {
      return FieldError(field, absl::StrCat("must be 'beginning' or 'end', got '", where, "'"));
    }
    absl::StatusOr<LayerRun> run = LayersOf(name, index, layers);
    if (!run.ok()) return FieldError(field, std::string(run.status().message()));
    const int layer = where == "beginning" ? run->first : run->last;
    const int boundary = where == "beginning" ? layer : layer + 1;
    if (boundary == 0) {
      return FieldError(field, absl::StrCat("'beginning' of the first layer (", name,
                                            ") would leave stage 0 without layers"));
    }
    if (boundary == n) {
      return FieldError(field, absl::StrCat("'end' of the last layer (", name,
                                            ") would leave the last stage without layers"));
    }
    const std::string described = absl::StrCat(name, ": ", where);
    auto [it, added] = boundaries.emplace(boundary, described);
    if (!added) {
      return FieldError(
          "split.points",
          absl::StrCat("'", it->second, "' and '", described, "' both cut between layers ",
                       layers[boundary - 1].name(), " and ", layers[boundary].name(),
                       ", which would leave a stage without layers; keep one of them"));
    }
  }
  std::vector<int> firsts = {0};
  for (const auto& [boundary, point] : boundaries) firsts.push_back(boundary);
  return firsts;
}

absl::StatusOr<Plan> PlanJob(const spec::JobSpec& spec) {
  if (spec.model.torchscript.has_value()) {
    return FieldError("model.torchscript",
                      "a TorchScript model's layers are only known from a worker's InspectModel; "
                      "plan it with them");
  }
  if (NeedsProfile(spec)) {
    const char* field = spec::IsAutoSchedule(spec.schedule)     ? "schedule.kind"
                        : spec.placement.memory_limit_bytes > 0 ? "placement.memory_limit"
                                                                : "split.policy";
    return FieldError(field,
                      "needs the layer times and sizes a worker's InspectModel profile measures; "
                      "plan with them");
  }
  return PlanJob(spec, BuiltinLayers(*spec.model.builtin));
}

absl::StatusOr<Plan> PlanJob(const spec::JobSpec& spec, std::vector<v1::LayerInfo> layers,
                             const PlanOptions& options) {
  RETURN_IF_ERROR(CheckSupported(spec, options));
  if (layers.empty()) return FieldError(ModelField(spec), "the model has no layers to split");
  if (static_cast<int64_t>(layers.size()) > options.limits.max_layers) {
    return FieldError(
        ModelField(spec),
        absl::StrCat("the model's ", layers.size(), " layers are over the limit of ",
                     options.limits.max_layers, " layers (the coordinator's --max-layers)"));
  }
  const int num_layers = static_cast<int>(layers.size());
  Plan plan;
  ASSIGN_OR_RETURN(plan.transport, ResolveTransport(spec.placement));
  plan.num_microbatches = spec.schedule.microbatches;
  plan.replicas = std::max(1, spec.placement.replicas);
  plan.shard = plan.replicas > 1 ? spec.placement.shard : spec::ShardLevel::kNone;

  StageRequest request;
  request.stages = spec.split.stages;
  std::vector<int> firsts;
  if (!spec.split.points.empty()) {
    ASSIGN_OR_RETURN(firsts, SplitPointsToFirstLayers(spec.split.points, layers));
    const int made = static_cast<int>(firsts.size());
    if (spec.split.stages > 0 && spec.split.stages != made) {
      std::vector<std::string> starts;
      for (int first : firsts) starts.push_back(layers[first].name());
      return FieldError(
          "split.stages",
          absl::StrCat("split.points make ", made, " stages (starting at layers ",
                       absl::StrJoin(starts, ", "), "), but split.stages is ", spec.split.stages));
    }
    request.stages = made;
    request.field = "split.points";
  }
  if (!spec.schedule.csv.empty()) {
    RETURN_IF_ERROR(PlanFileSchedule(spec, request, num_layers, &plan));
  } else {
    RETURN_IF_ERROR(PlanGeneratedSchedule(spec, request, num_layers, options.limits, &plan));
  }

  RETURN_IF_ERROR(options.Interrupted("building the schedule"));
  const int64_t actions = ActionCount(plan.lowered);
  if (actions > options.limits.max_actions) {
    return FieldError(
        spec.schedule.csv.empty() ? "schedule.microbatches" : "schedule.csv",
        absl::StrCat("the schedule has ", actions, " actions over its ranks, over the limit of ",
                     options.limits.max_actions, " (the coordinator's --max-actions)"));
  }

  // Partition layers into stages.
  plan.split = spec.split.policy;
  if (!options.stage_first_layers.empty()) {
    plan.split = "recorded";
    firsts = options.stage_first_layers;
    bool fits = static_cast<int>(firsts.size()) == plan.num_stages && firsts[0] == 0;
    for (size_t s = 1; fits && s < firsts.size(); ++s) {
      fits = firsts[s] > firsts[s - 1] && firsts[s] < num_layers;
    }
    if (!fits) {
      return FieldError(
          "split",
          absl::StrCat("the recorded partition (first layers ", absl::StrJoin(firsts, ", "),
                       ") does not fit ", num_layers, " layers in ", plan.num_stages, " stages"));
    }
  } else if (!firsts.empty()) {
    plan.split = "points";
    if (static_cast<int>(firsts.size()) != plan.num_stages) {
      return FieldError("split.points",
                        absl::StrCat("the points make ", firsts.size(), " stages, but the ",
                                     plan.schedule_name, " schedule runs ", plan.num_stages));
    }
  } else {
    plan.layers = layers;
    ASSIGN_OR_RETURN(firsts, SplitByPolicy(spec, plan, options));
  }
  plan.stages = planning::StagesFor(firsts, layers);
  plan.layers = std::move(layers);
  ASSIGN_OR_RETURN(plan.predicted_memory, PredictMemory(spec, plan));
  plan.predicted_ranks =
      PredictRankTimes(plan, DefaultCostAssumptions(), &plan.predicted_in_seconds);
  return plan;
}
}  // namespace stagecoach::coordinator
