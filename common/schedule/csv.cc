#include "common/schedule/csv.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/schedule/lowering.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"

namespace stagecoach::schedule {
namespace {

constexpr absl::string_view kDefaultSource = "schedule CSV";

// "<source> line 2 (rank 1), column 5 (step 4)", or without the column part.
std::string Place(absl::string_view source, size_t line, std::optional<size_t> column) {
  std::string place = absl::StrCat(source, " line ", line + 1, " (rank ", line, ")");
  if (column.has_value())
    absl::StrAppend(&place, ", column ", *column + 1, " (step ", *column, ")");
  return place;
}

absl::Status FieldError(absl::string_view source, size_t line, size_t column,
                        absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(Place(source, line, column), ": ", why));
}

// Removes the double quotes around a field; nothing else may be quoted.
absl::StatusOr<absl::string_view> Unquote(absl::string_view source, absl::string_view field,
                                          size_t line, size_t column) {
  const size_t quote = field.find('"');
  if (quote == absl::string_view::npos) return field;
  if (field.size() >= 2 && field.front() == '"' && field.back() == '"' &&
      field.substr(1, field.size() - 2).find('"') == absl::string_view::npos) {
    return field.substr(1, field.size() - 2);
  }
  return FieldError(source, line, column,
                    absl::StrCat("stray double quote in field \"", field,
                                 "\" (a field may only be wrapped in quotes as a whole)"));
}

// A leaf's stage and microbatch against `limits`.
absl::Status CheckIndices(const Action& entry, const CsvLimits& limits, absl::string_view source,
                          size_t line, size_t column) {
  for (const Action* leaf : LeafActions(entry)) {
    if (leaf->stage >= limits.max_stages) {
      return FieldError(source, line, column,
                        absl::StrCat(DescribeLeaf(*leaf, entry), " names stage ", leaf->stage,
                                     "; stage indices must be below ", limits.max_stages,
                                     " (the limit on stages)"));
    }
    if (leaf->microbatch.has_value() && *leaf->microbatch >= limits.max_microbatches) {
      return FieldError(source, line, column,
                        absl::StrCat(DescribeLeaf(*leaf, entry), " names microbatch ",
                                     *leaf->microbatch, "; microbatch indices must be below ",
                                     limits.max_microbatches, " (the limit on microbatches)"));
    }
  }
  return absl::OkStatus();
}

// Reads the rows one line and one field at a time, checking `limits` before each is stored.
absl::StatusOr<PipelineOrder> ParseRows(absl::string_view text, absl::string_view source,
                                        const CsvLimits& limits) {
  PipelineOrder order;
  if (text.empty()) return order;
  if (text.back() == '\n') text.remove_suffix(1);  // final terminator
  int64_t total = 0;
  size_t line = 0;
  for (absl::string_view row : absl::StrSplit(text, '\n')) {
    if (line >= static_cast<size_t>(std::max(limits.max_ranks, 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          Place(source, line, std::nullopt), ": the file has more than ", limits.max_ranks,
          " rows; a schedule has at most ", limits.max_ranks, " ranks (the limit on ranks)"));
    }
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    RankActions actions;
    if (!row.empty()) {
      size_t column = 0;
      for (absl::string_view raw : absl::StrSplit(row, ',')) {
        if (column >= static_cast<size_t>(std::max(limits.max_fields_per_rank, 0))) {
          return FieldError(
              source, line, column,
              absl::StrCat("rank ", line, " has more than ", limits.max_fields_per_rank,
                           " fields (actions and idle slots); the limit is ",
                           limits.max_fields_per_rank, " per rank"));
        }
        if (total >= limits.max_fields) {
          return FieldError(source, line, column,
                            absl::StrCat("the file has more than ", limits.max_fields,
                                         " fields (actions and idle slots); the limit is ",
                                         limits.max_fields, " in all"));
        }
        ++total;
        auto field = Unquote(source, raw, line, column);
        if (!field.ok()) return field.status();
        auto action = ParseAction(*field);
        if (!action.ok()) return FieldError(source, line, column, action.status().message());
        if (action->has_value()) {
          RETURN_IF_ERROR(CheckIndices(**action, limits, source, line, column));
        }
        actions.push_back(*std::move(action));
        ++column;
      }
    }
    order.push_back(std::move(actions));
    ++line;
  }
  return order;
}

// The counts of stages and microbatches (explicit or from the file) against their limits, and their
// product against the field limit, before the validator allocates its per-(stage, microbatch)
// tables.
absl::Status CheckCountLimits(int stages, int microbatches, const CsvLimits& limits,
                              absl::string_view source) {
  if (stages < 1 || microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", stages, " stages and ",
                                                   microbatches,
                                                   " microbatches; both must be at least 1"));
  }
  if (stages > limits.max_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", stages, " stages is more than the limit of ", limits.max_stages, " stages"));
  }
  if (microbatches > limits.max_microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", microbatches,
                                                   " microbatches is more than the limit of ",
                                                   limits.max_microbatches, " microbatches"));
  }
  if (static_cast<int64_t>(stages) * microbatches > limits.max_fields) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", stages, " stages x ", microbatches, " microbatches need ",
        static_cast<int64_t>(stages) * microbatches, " forward actions, more than the limit of ",
        limits.max_fields, " fields in a file"));
  }
  return absl::OkStatus();
}

bool AdmittedBy(CsvFormat format, ActionType type) {
  if (format == CsvFormat::kComputeComms) return true;
  return IsCompute(type) || type == ActionType::kReduceGrad;
}

// The first action `format` does not admit, as an error.
absl::Status CheckFormat(const PipelineOrder& order, CsvFormat format, absl::string_view source) {
  for (size_t rank = 0; rank < order.size(); ++rank) {
    for (size_t step = 0; step < order[rank].size(); ++step) {
      const std::optional<Action>& action = order[rank][step];
      if (!action.has_value() || AdmittedBy(format, action->type)) continue;
      return FieldError(source, rank, step,
                        absl::StrCat(action->ToString(), " is a ", ActionTypeName(action->type),
                                     " action, which a compute_only schedule cannot hold (it "
                                     "admits F, I, B, W, OVERLAP_F_B and REDUCE_GRAD; lowered "
                                     "schedules are read with format compute_comms)"));
    }
  }
  return absl::OkStatus();
}

// One more than the largest stage and microbatch index in `order`.
std::pair<int, int> IndexBounds(const PipelineOrder& order) {
  int stages = 0, microbatches = 0;
  for (const RankActions& actions : order) {
    for (const std::optional<Action>& action : actions) {
      if (!action.has_value()) continue;
      for (const Action* leaf : LeafActions(*action)) {
        stages = std::max(stages, leaf->stage + 1);
        if (leaf->microbatch.has_value()) {
          microbatches = std::max(microbatches, *leaf->microbatch + 1);
        }
      }
    }
  }
  return {stages, microbatches};
}

// The stage-to-rank map a lowered file implies: each stage on the row where it first appears.
absl::StatusOr<std::vector<int>> InferStageToRank(const PipelineOrder& order, int num_stages,
                                                  absl::string_view source) {
  std::vector<int> stage_to_rank(num_stages, -1);
  std::vector<size_t> first_step(num_stages, 0);
  for (size_t rank = 0; rank < order.size(); ++rank) {
    for (size_t step = 0; step < order[rank].size(); ++step) {
      if (!order[rank][step].has_value()) continue;
      for (const Action* leaf : LeafActions(*order[rank][step])) {
        const int s = leaf->stage;
        if (s < 0 || s >= num_stages) {
          return FieldError(source, rank, step,
                            absl::StrCat(leaf->ToString(), " names stage ", s, ", outside [0, ",
                                         num_stages, ")"));
        }
        if (stage_to_rank[s] == -1) {
          stage_to_rank[s] = static_cast<int>(rank);
          first_step[s] = step;
        } else if (stage_to_rank[s] != static_cast<int>(rank)) {
          return FieldError(
              source, rank, step,
              absl::StrCat(leaf->ToString(), " runs stage ", s, ", which already runs on rank ",
                           stage_to_rank[s], " (", Place(source, stage_to_rank[s], first_step[s]),
                           "); a stage runs on exactly one rank"));
        }
      }
    }
  }
  for (int s = 0; s < num_stages; ++s) {
    if (stage_to_rank[s] == -1) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": stage ", s,
                                                     " has no actions on any rank (stages 0..",
                                                     num_stages - 1, " must all appear)"));
    }
  }
  return stage_to_rank;
}

// A validator error, prefixed with the line and column it points at. The validator's own
// "Rank R, step T: " prefix is dropped as the place says the same.
absl::Status Located(const absl::Status& status, absl::string_view source) {
  std::optional<ScheduleErrorLocation> where = ErrorLocation(status);
  if (!where.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", status.message()));
  }
  absl::string_view message = status.message();
  if (where->step.has_value()) {
    absl::ConsumePrefix(&message,
                        absl::StrCat("Rank ", where->rank, ", step ", *where->step, ": "));
  }
  std::optional<size_t> column;
  if (where->step.has_value()) column = static_cast<size_t>(*where->step);
  return absl::InvalidArgumentError(
      absl::StrCat(Place(source, where->rank, column), ": ", message));
}

}  // namespace

absl::StatusOr<PipelineOrder> ParseScheduleCsv(absl::string_view text, const CsvLimits& limits) {
  return ParseRows(text, kDefaultSource, limits);
}

absl::StatusOr<CsvFormat> ParseCsvFormat(absl::string_view name) {
  for (CsvFormat format : {CsvFormat::kComputeOnly, CsvFormat::kComputeComms}) {
    if (name == CsvFormatName(format)) return format;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule CSV format '", name,
                                                 "'; valid formats: compute_only, compute_comms"));
}

absl::string_view CsvFormatName(CsvFormat format) {
  return format == CsvFormat::kComputeOnly ? "compute_only" : "compute_comms";
}

absl::StatusOr<LoadedSchedule> LoadScheduleCsv(absl::string_view text, CsvFormat format,
                                               const CsvLoadOptions& options) {
  const absl::string_view source = options.source;
  LoadedSchedule loaded;
  loaded.format = format;
  ASSIGN_OR_RETURN(loaded.order, ParseRows(text, source, options.limits));
  RETURN_IF_ERROR(CheckFormat(loaded.order, format, source));
  loaded.num_ranks = static_cast<int>(loaded.order.size());
  const auto [stages, microbatches] = IndexBounds(loaded.order);
  if (loaded.num_ranks == 0 || stages == 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, " holds no actions"));
  }
  loaded.num_stages = options.num_stages.value_or(stages);
  loaded.num_microbatches = options.num_microbatches.value_or(std::max(microbatches, 1));
  RETURN_IF_ERROR(
      CheckCountLimits(loaded.num_stages, loaded.num_microbatches, options.limits, source));
  ValidationOptions validation;
  validation.has_backward = options.has_backward;

  if (format == CsvFormat::kComputeOnly) {
    auto mapping = ValidateComputeSchedule(loaded.order, loaded.num_ranks, loaded.num_stages,
                                           loaded.num_microbatches, validation);
    if (!mapping.ok()) return Located(mapping.status(), source);
    loaded.stage_to_rank = *std::move(mapping);
    LoweringOptions lowering;
    lowering.max_active_stages = options.max_active_stages;
    auto lowered = LowerSchedule(loaded.order, loaded.stage_to_rank, loaded.num_stages,
                                 loaded.num_microbatches, lowering);
    if (!lowered.ok()) return Located(lowered.status(), source);
    loaded.lowered = *std::move(lowered);
  } else {
    ASSIGN_OR_RETURN(loaded.stage_to_rank,
                     InferStageToRank(loaded.order, loaded.num_stages, source));
    loaded.lowered = loaded.order;
  }
  validation.sharded_parameters = options.sharded_parameters;
  absl::Status valid = ValidateLoweredSchedule(
      loaded.lowered, loaded.stage_to_rank, loaded.num_stages, loaded.num_microbatches, validation);
  if (!valid.ok()) {
    if (format == CsvFormat::kComputeComms) return Located(valid, source);
    // Steps here count in the lowered list, not in the file.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the lowered schedule is invalid: ", valid.message()));
  }
  return loaded;
}

std::string FormatScheduleCsv(const PipelineOrder& order) {
  std::string out;
  for (const RankActions& actions : order) {
    if (actions.size() == 1 && !actions[0].has_value()) {
      out += "\"\"\n";
      continue;
    }
    for (size_t i = 0; i < actions.size(); ++i) {
      if (i > 0) out += ',';
      if (actions[i].has_value()) out += actions[i]->ToString();
    }
    out += '\n';
  }
  return out;
}

}  // namespace stagecoach::schedule
