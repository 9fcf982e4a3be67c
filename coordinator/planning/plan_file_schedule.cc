// The planner's schedule files (schedule.csv): see planner_parts.h.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/schedule/build.h"
#include "common/schedule/csv.h"
#include "common/util/status_macros.h"
#include "coordinator/planning/planner_parts.h"

namespace stagecoach::coordinator::planning {
namespace {

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

// What a schedule file runs: how many stages and microbatches, and whether it has a backward.
struct FileShape {
  int stages = 0;
  int microbatches = 0;
  bool has_backward = false;
};

// The shape of the file's `rows`; INVALID_ARGUMENT (line and column) for a stage the model
// cannot have, before the validator sizes its tables by the stages.
absl::StatusOr<FileShape> ReadFileShape(const schedule::PipelineOrder& rows,
                                        const std::string& file, int64_t layers) {
  FileShape shape;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t step = 0; step < rows[r].size(); ++step) {
      const std::optional<schedule::Action>& action = rows[r][step];
      if (!action.has_value()) continue;
      for (const schedule::Action* leaf : schedule::LeafActions(*action)) {
        if (leaf->stage >= layers) {
          return FieldError(
              "schedule.csv",
              absl::StrCat(file, " line ", r + 1, " (rank ", r, "), column ", step + 1, " (step ",
                           step, "): ", action->ToString(), " runs stage ", leaf->stage,
                           ", but the model has ", layers,
                           " layers, so at most that many stages (a stage needs a layer)"));
        }
        shape.stages = std::max(shape.stages, leaf->stage + 1);
        if (leaf->microbatch.has_value()) {
          shape.microbatches = std::max(shape.microbatches, *leaf->microbatch + 1);
        }
        switch (leaf->type) {
          case schedule::ActionType::kForward:
          case schedule::ActionType::kSendF:
          case schedule::ActionType::kRecvF:
          case schedule::ActionType::kUnshard:
          case schedule::ActionType::kReshard:
            break;
          default:  // B, I, W, SEND_B, RECV_B, REDUCE_GRAD
            shape.has_backward = true;
        }
      }
    }
  }
  return shape;
}

// Takes the loaded file's placement and lists into `plan`, checking that every rank runs a
// stage, the stages fit the model, and placement.style agrees.
absl::Status AdoptLoadedFile(const spec::JobSpec& spec, schedule::LoadedSchedule loaded,
                             bool has_backward, int64_t layers, Plan* plan) {
  const std::string& file = spec.schedule.csv;
  plan->num_ranks = loaded.num_ranks;
  plan->num_stages = loaded.num_stages;
  plan->stages_per_rank = 0;
  for (int r = 0; r < plan->num_ranks; ++r) {
    const int held =
        static_cast<int>(std::count(loaded.stage_to_rank.begin(), loaded.stage_to_rank.end(), r));
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
  RETURN_IF_ERROR(CheckStyle(spec.placement, loaded.stage_to_rank, plan->num_ranks,
                             absl::StrCat("the rows of '", file, "'"),
                             [](int rank) { return absl::StrCat(" (line ", rank + 1, ")"); }));
  plan->has_backward = has_backward;
  if (!has_backward) {
    plan->kind = schedule::ScheduleKind::kForwardOnly;
  } else if (auto kind =
                 MatchingGenerator(loaded.order, plan->num_stages, plan->num_microbatches)) {
    plan->kind = *kind;
  }
  plan->stage_to_rank = std::move(loaded.stage_to_rank);
  plan->lowered.assign(loaded.lowered.size(), {});
  for (size_t r = 0; r < loaded.lowered.size(); ++r) {
    for (auto& action : loaded.lowered[r]) {
      if (action.has_value()) plan->lowered[r].push_back(std::move(action));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// schedule.csv: the file's lists (schedule.csv_text), checked against the spec, lowered if
// compute_only, validated. Stage placement and worker count come from the file's rows.
absl::Status PlanFileSchedule(const spec::JobSpec& spec, const StageRequest& request,
                              int64_t layers, Plan* plan) {
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
  // UNSHARD/RESHARD only where the stages' parameters are sharded, as for generated schedules.
  options.max_active_stages = UnshardWindowOf(spec, static_cast<int>(layers));
  options.sharded_parameters = options.max_active_stages > 0;

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
  ASSIGN_OR_RETURN(const FileShape shape, ReadFileShape(*rows, file, layers));
  const int file_stages = shape.stages, file_microbatches = shape.microbatches;
  const bool has_backward = shape.has_backward;
  // Indices past the spec's counts are the validator's to report, at their line and column.
  if (file_microbatches > 0 && file_microbatches < m) {
    return FieldError(
        "schedule.microbatches",
        absl::StrCat("'", file, "' schedules ", file_microbatches, " microbatches (0..",
                     file_microbatches - 1, "), but schedule.microbatches is ", m));
  }
  if (request.stages > 0 && file_stages > 0 && file_stages < request.stages) {
    return FieldError(
        request.field,
        absl::StrCat("'", file, "' runs ", file_stages, " stages (0..", file_stages - 1, "), but ",
                     request.from_points() ? "split.points make " : "split.stages is ",
                     request.stages));
  }
  if (request.stages > 0) {
    options.num_stages = request.stages;
  } else if (file_stages > 0) {
    options.num_stages = file_stages;
  }
  options.has_backward = has_backward;
  auto loaded = schedule::LoadScheduleCsv(text, *format, options);
  if (!loaded.ok()) return FieldError("schedule.csv", loaded.status().message());

  return AdoptLoadedFile(spec, *std::move(loaded), has_backward, layers, plan);
}

}  // namespace stagecoach::coordinator::planning
