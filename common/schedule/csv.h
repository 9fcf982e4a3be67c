// Schedules as CSV, the layout torch.distributed.pipelining's _dump_csv / _load_csv use: one row
// per rank (row r = rank r), comma-separated actions in PyTorch's syntax, an empty field for an
// idle slot. Both PyTorch formats (compute-only and compute + comms) share this layout; which
// actions a format admits is for the caller to check.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/action.h"

namespace stagecoach::schedule {

// What a schedule CSV may hold. A file is text a user (or, through a spec's schedule.csv_text,
// anyone who may submit a job) hands us, so every size the rest of the schedule library allocates
// by (rows, fields, stage and microbatch indices, which size the validator's and the lowering's
// per-(stage, microbatch) tables) is checked against these while the file is read, before any
// such allocation. The defaults are far above real jobs (PyTorch's own schedules have tens of
// ranks and stages and hundreds of microbatches) and keep the worst case to tens of MB:
// 1,000,000 fields is ~100 MB of parsed actions at most, and stages x microbatches of 1,000,000
// is 8 MB per validator table.
struct CsvLimits {
  // Rows (ranks).
  int max_ranks = 4096;
  // Fields (actions and idle slots) in one row.
  int max_fields_per_rank = 262144;
  // Fields in the whole file.
  int64_t max_fields = 1000000;
  // Stage indices are below this, and so is an explicit CsvLoadOptions::num_stages.
  int max_stages = 4096;
  // Microbatch indices are below this, and so is an explicit CsvLoadOptions::num_microbatches.
  int max_microbatches = 65536;
  // Stages times microbatches is at most max_fields: every stage runs a forward of every
  // microbatch, so a file within the field limit cannot schedule more.
};

// Parses CSV text. Each line is one rank; CR before LF (PyTorch writes CRLF) is ignored, and the
// terminator of the last line is optional. An empty line is a rank without actions; a line that
// is just `""` (Python's csv module writes a lone empty field that way) is one idle slot. Fields
// may be wrapped in double quotes. Errors are INVALID_ARGUMENT naming the line (rank) and column
// and quoting the bad field; a file past one of `limits` is INVALID_ARGUMENT naming the place
// where it first goes past and the limit.
absl::StatusOr<PipelineOrder> ParseScheduleCsv(absl::string_view text,
                                               const CsvLimits& limits = {});

// Writes `order` as CSV with LF line endings, one line per rank, idle slots as empty fields
// (a rank that is a single idle slot as `""`). ParseScheduleCsv reads it back unchanged.
std::string FormatScheduleCsv(const PipelineOrder& order);

// PyTorch's two CSV formats (its _load_csv / _dump_csv `format` argument).
enum class CsvFormat {
  // "compute_only": F, I, B, W and OVERLAP_F_B (and idle slots); the runtime lowers it. Ours also
  // reads REDUCE_GRAD, which PyTorch's GPipe and 1F1B lists carry.
  kComputeOnly,
  // "compute_comms": a lowered list, executed as written: compute plus SEND_F, RECV_F, SEND_B,
  // RECV_B, UNSHARD, RESHARD and REDUCE_GRAD.
  kComputeComms,
};

// "compute_only" or "compute_comms". INVALID_ARGUMENT naming the valid formats otherwise.
absl::StatusOr<CsvFormat> ParseCsvFormat(absl::string_view name);
absl::string_view CsvFormatName(CsvFormat format);

// How LoadScheduleCsv reads a schedule.
struct CsvLoadOptions {
  // Pipeline stages and microbatches; when unset, one more than the largest index in the file.
  std::optional<int> num_stages;
  std::optional<int> num_microbatches;
  // False for forward-only schedules (see ValidationOptions).
  bool has_backward = true;
  // Lowering of a compute_only file (LowerSchedule).
  int max_active_stages = 3;
  // The lowered lists run on sharded parameters (ValidationOptions::sharded_parameters): a
  // compute_comms file must UNSHARD and RESHARD its stages itself.
  bool sharded_parameters = false;
  // Names the file in errors, e.g. "my_schedule.csv".
  std::string source = "schedule CSV";
  // What the file (and num_stages / num_microbatches above) may hold.
  CsvLimits limits;
};

// A schedule read from CSV, checked, and ready to execute.
struct LoadedSchedule {
  CsvFormat format = CsvFormat::kComputeOnly;
  // The rows as read (row r = rank r).
  PipelineOrder order;
  int num_ranks = 0;
  int num_stages = 0;
  int num_microbatches = 0;
  // Element s: the rank (row) whose actions run stage s.
  std::vector<int> stage_to_rank;
  // What the ranks execute: `order` lowered (compute_only) or `order` itself (compute_comms).
  PipelineOrder lowered;
};

// Reads a schedule a user wrote or PyTorch dumped, in `format`, and checks it: actions the format
// does not admit, every compute rule (ValidateComputeSchedule) and, for compute_comms, the comms
// rules and deadlock freedom (ValidateLoweredSchedule). Every error is INVALID_ARGUMENT and names
// the place: "<source> line L (rank r), column C (step c): ..." for one action, "<source> line L
// (rank r): ..." for a stage held by that rank, followed by the explanation and PyTorch's grid.
// A file or count past options.limits is refused the same way before anything is allocated by
// it: "<source> line 1 (rank 0), column 1 (step 0): 999999999F0 names stage 999999999; stage
// indices must be below 4096 (the limit on stages)".
absl::StatusOr<LoadedSchedule> LoadScheduleCsv(absl::string_view text, CsvFormat format,
                                               const CsvLoadOptions& options = {});

}  // namespace stagecoach::schedule
