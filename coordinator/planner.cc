#include "coordinator/planner.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/build.h"
#include "common/schedule/csv.h"
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
  const std::string& family = spec.model.builtin->family;
  if (family != "mlp" && family != "gpt") {
    return FieldError("model.builtin.family",
                      absl::StrCat("family '", family,
                                   "' is not supported by this coordinator yet (supported: mlp, "
                                   "gpt)"));
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
  // Synthetic data is drawn for an MLP's sizes, a tensors file (torch.save'd inputs and
  // targets) feeds an MLP, a tokens file feeds a GPT.
  const std::string& kind = spec.data.kind;
  if (kind != "synthetic" && kind != "tokens" && kind != "tensors") {
    return FieldError("data.kind",
                      absl::StrCat("'", kind,
                                   "' data is not supported by this coordinator yet (supported: "
                                   "synthetic or tensors for mlp, tokens for gpt)"));
  }
  const bool fits = family == "gpt" ? kind == "tokens" : kind == "synthetic" || kind == "tensors";
  if (!fits) {
    return FieldError(
        "data.kind",
        absl::StrCat("'", kind, "' data cannot feed a ", family, " model (use data.kind ",
                     family == "gpt" ? "tokens" : "synthetic or tensors", ")"));
  }
  if ((kind == "tokens" || kind == "tensors") && spec.data.path.empty()) {
    return FieldError("data.path", absl::StrCat("required for data.kind ", kind));
  }
  if (family == "gpt" && spec.training.loss != "cross_entropy") {
    return FieldError("training.loss",
                      absl::StrCat("'", spec.training.loss,
                                   "' cannot train a gpt model (its targets are next tokens; use "
                                   "cross_entropy)"));
  }
  return absl::OkStatus();
}

// placement.transport with "auto" resolved: nccl for cuda, gloo for cpu.
absl::StatusOr<std::string> ResolveTransport(const spec::PlacementSpec& placement) {
  const std::string& transport = placement.transport;
  if (transport.empty() || transport == "auto") {
    return std::string(placement.device == "cuda" ? "nccl" : "gloo");
  }
  if (transport != "gloo" && transport != "nccl") {
    return FieldError("placement.transport",
                      absl::StrCat("must be one of auto, gloo, nccl, got '", transport, "'"));
  }
  if (transport == "nccl" && placement.device != "cuda") {
    return FieldError("placement.transport",
                      absl::StrCat("nccl needs placement.device cuda (device is ", placement.device,
                                   "; use gloo or auto)"));
  }
  return transport;
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

absl::Status CheckStagesFitLayers(int stages, int64_t layers) {
  if (stages <= layers) return absl::OkStatus();
  return FieldError("split.stages", absl::StrCat("must be <= ", layers,
                                                 " (the model's layers; a stage needs at least "
                                                 "one), got ",
                                                 stages));
}

// schedule.kind: stage and worker counts, then the generator's lists, placed, lowered and
// validated.
absl::Status PlanGeneratedSchedule(const spec::JobSpec& spec, int64_t layers, Plan* plan) {
  auto kind = schedule::ParseScheduleKind(spec.schedule.kind);
  if (!kind.ok()) return FieldError("schedule.kind", kind.status().message());
  plan->kind = *kind;
  const absl::string_view name = schedule::ScheduleKindName(*kind);
  plan->schedule_name = std::string(name);
  plan->has_backward = schedule::HasBackward(*kind);

  const int default_spr = schedule::DefaultStagesPerRank(*kind);
  const int stages = spec.split.stages;
  const int workers = spec.placement.workers;
  if (stages > 0 && workers > 0) {
    if (stages % workers != 0) {
      return FieldError("placement.workers",
                        absl::StrCat(stages, " stages do not divide evenly among ", workers,
                                     " workers (split.stages must be a multiple of "
                                     "placement.workers)"));
    }
    plan->num_stages = stages;
    plan->num_ranks = workers;
  } else if (stages > 0) {
    if (stages % default_spr != 0) {
      return FieldError(
          "split.stages",
          absl::StrCat(name, " runs ", default_spr,
                       " stages per worker unless placement.workers says otherwise, "
                       "and ",
                       stages, " is not a multiple of ", default_spr, "; give placement.workers"));
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
  RETURN_IF_ERROR(CheckStagesFitLayers(plan->num_stages, layers));

  // Generate, lower and validate. Unsharded stages: no UNSHARD/RESHARD.
  schedule::ScheduleConfig config;
  config.kind = plan->kind;
  config.num_ranks = plan->num_ranks;
  config.stages_per_rank = plan->stages_per_rank;
  config.num_microbatches = plan->num_microbatches;
  schedule::LoweringOptions lowering;
  lowering.max_active_stages = 0;
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

// The compute actions (F, I, B, W, OVERLAP_F_B) of each rank, in order.
std::vector<std::vector<schedule::Action>> ComputeActions(const schedule::PipelineOrder& order) {
  std::vector<std::vector<schedule::Action>> out(order.size());
  for (size_t r = 0; r < order.size(); ++r) {
    for (const auto& action : order[r]) {
      if (action.has_value() && schedule::IsCompute(action->type)) out[r].push_back(*action);
    }
  }
  return out;
}

// The generator whose lists run the same compute actions in the same order on every rank as
// `order` (a file PyTorch dumped from that schedule), if any.
std::optional<schedule::ScheduleKind> MatchingGenerator(const schedule::PipelineOrder& order,
                                                        int num_stages, int num_microbatches) {
  const int ranks = static_cast<int>(order.size());
  if (ranks == 0 || num_stages % ranks != 0) return std::nullopt;
  const auto file = ComputeActions(order);
  for (schedule::ScheduleKind kind : schedule::AllScheduleKinds()) {
    schedule::ScheduleConfig config;
    config.kind = kind;
    config.num_ranks = ranks;
    config.stages_per_rank = num_stages / ranks;
    config.num_microbatches = num_microbatches;
    auto generated = schedule::GenerateSchedule(config);
    if (generated.ok() && ComputeActions(*generated) == file) return kind;
  }
  return std::nullopt;
}

// schedule.csv: the file's lists (schedule.csv_text), checked against the spec, lowered if
// compute_only, validated. Stage placement and worker count come from the file's rows.
absl::Status PlanFileSchedule(const spec::JobSpec& spec, int64_t layers, Plan* plan) {
  const std::string& file = spec.schedule.csv;
  const std::string& text = spec.schedule.csv_text;
  if (text.empty()) {
    return FieldError("schedule.csv",
                      absl::StrCat("the contents of '", file,
                                   "' were not sent with the spec (schedule.csv_text is empty); "
                                   "stagectl submit reads the file and sends them"));
  }
  auto format = schedule::ParseCsvFormat(spec.schedule.csv_format);
  if (!format.ok()) return FieldError("schedule.csv_format", format.status().message());
  plan->schedule_name = absl::StrCat("csv:", file);
  const int m = plan->num_microbatches;
  schedule::CsvLoadOptions options;
  options.source = file;
  options.num_microbatches = m;
  options.max_active_stages = 0;  // unsharded stages, as for generated schedules

  // A first read for what the spec must agree with: rows, stages, microbatches, backward.
  auto rows = schedule::ParseScheduleCsv(text);
  if (!rows.ok()) {
    auto located = schedule::LoadScheduleCsv(text, *format, options);  // names the file
    return FieldError("schedule.csv",
                      located.ok() ? rows.status().message() : located.status().message());
  }
  const int num_rows = static_cast<int>(rows->size());
  const int workers = spec.placement.workers;
  if (workers > 0 && num_rows > workers) {
    return FieldError(
        "schedule.csv",
        absl::StrCat(file, " line ", workers + 1, " (rank ", workers, "): the file has ", num_rows,
                     " rows (one per rank), but placement.workers is ", workers));
  }
  if (workers > 0 && num_rows < workers) {
    return FieldError("schedule.csv", absl::StrCat(file, ": the file has ", num_rows,
                                                   " rows (one per rank), but placement.workers "
                                                   "is ",
                                                   workers));
  }
  int file_stages = 0, file_microbatches = 0;
  bool has_backward = false;
  for (size_t r = 0; r < rows->size(); ++r) {
    for (size_t step = 0; step < (*rows)[r].size(); ++step) {
      const std::optional<schedule::Action>& action = (*rows)[r][step];
      if (!action.has_value()) continue;
      for (const schedule::Action* leaf : schedule::LeafActions(*action)) {
        if (leaf->stage >= layers) {  // before the validator sizes its tables by the stages
          return FieldError(
              "schedule.csv",
              absl::StrCat(file, " line ", r + 1, " (rank ", r, "), column ", step + 1, " (step ",
                           step, "): ", action->ToString(), " runs stage ", leaf->stage,
                           ", but the model has ", layers,
                           " layers, so at most that many stages (a stage needs a layer)"));
        }
        file_stages = std::max(file_stages, leaf->stage + 1);
        if (leaf->microbatch.has_value()) {
          file_microbatches = std::max(file_microbatches, *leaf->microbatch + 1);
        }
        switch (leaf->type) {
          case schedule::ActionType::kForward:
          case schedule::ActionType::kSendF:
          case schedule::ActionType::kRecvF:
          case schedule::ActionType::kUnshard:
          case schedule::ActionType::kReshard:
            break;
          default:  // B, I, W, SEND_B, RECV_B, REDUCE_GRAD
            has_backward = true;
        }
      }
    }
  }
  // Indices past the spec's counts are the validator's to report, at their line and column.
  if (file_microbatches > 0 && file_microbatches < m) {
    return FieldError(
        "schedule.microbatches",
        absl::StrCat("'", file, "' schedules ", file_microbatches, " microbatches (0..",
                     file_microbatches - 1, "), but schedule.microbatches is ", m));
  }
  if (spec.split.stages > 0 && file_stages > 0 && file_stages < spec.split.stages) {
    return FieldError("split.stages",
                      absl::StrCat("'", file, "' runs ", file_stages, " stages (0..",
                                   file_stages - 1, "), but split.stages is ", spec.split.stages));
  }
  if (spec.split.stages > 0) {
    options.num_stages = spec.split.stages;
  } else if (file_stages > 0) {
    options.num_stages = file_stages;
  }
  options.has_backward = has_backward;
  auto loaded = schedule::LoadScheduleCsv(text, *format, options);
  if (!loaded.ok()) return FieldError("schedule.csv", loaded.status().message());

  plan->num_ranks = loaded->num_ranks;
  plan->num_stages = loaded->num_stages;
  plan->stages_per_rank = 0;
  for (int r = 0; r < plan->num_ranks; ++r) {
    const int held =
        static_cast<int>(std::count(loaded->stage_to_rank.begin(), loaded->stage_to_rank.end(), r));
    if (held == 0) {
      return FieldError("schedule.csv",
                        absl::StrCat(file, " line ", r + 1, " (rank ", r,
                                     "): the rank runs no stage; every worker needs one"));
    }
    plan->stages_per_rank = std::max(plan->stages_per_rank, held);
  }
  if (plan->num_stages > layers) {
    return FieldError("schedule.csv",
                      absl::StrCat(file, " runs ", plan->num_stages, " stages, but the model has ",
                                   layers, " layers (a stage needs at least one)"));
  }
  RETURN_IF_ERROR(CheckStyle(spec.placement, loaded->stage_to_rank, plan->num_ranks,
                             absl::StrCat("the rows of '", file, "'"),
                             [](int rank) { return absl::StrCat(" (line ", rank + 1, ")"); }));
  plan->has_backward = has_backward;
  if (!has_backward) {
    plan->kind = schedule::ScheduleKind::kForwardOnly;
  } else if (auto kind = MatchingGenerator(loaded->order, plan->num_stages, m)) {
    plan->kind = *kind;
  }
  plan->stage_to_rank = std::move(loaded->stage_to_rank);
  plan->lowered.assign(loaded->lowered.size(), {});
  for (size_t r = 0; r < loaded->lowered.size(); ++r) {
    for (auto& action : loaded->lowered[r]) {
      if (action.has_value()) plan->lowered[r].push_back(std::move(action));
    }
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
  } else if (model.family == "gpt") {
    const int64_t d = model.d_model;
    // embed: token and position tables.
    out.push_back(model.vocab * d + model.seq * d);
    // A block: ln1 (2d), attn.qkv (3d*d + 3d), attn.proj (d*d + d), ln2 (2d), mlp.fc (4d*d + 4d),
    // mlp.proj (4d*d + d).
    for (int64_t i = 0; i < model.layers; ++i) out.push_back(12 * d * d + 13 * d);
    out.push_back(2 * d);            // norm
    out.push_back(d * model.vocab);  // head, no bias
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
  ASSIGN_OR_RETURN(plan.transport, ResolveTransport(spec.placement));
  plan.num_microbatches = spec.schedule.microbatches;
  const int64_t layers = spec::BuiltinLayerCount(*spec.model.builtin);
  if (!spec.schedule.csv.empty()) {
    RETURN_IF_ERROR(PlanFileSchedule(spec, layers, &plan));
  } else {
    RETURN_IF_ERROR(PlanGeneratedSchedule(spec, layers, &plan));
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
  return plan;
}
}  // namespace stagecoach::coordinator
