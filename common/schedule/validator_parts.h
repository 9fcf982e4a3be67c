// Internals of the schedule validator (validator.h) shared by its files: validator.cc (counts,
// compute rules, the grid, error locations) and comm_checks.cc (a lowered schedule's send/recv
// rules and deadlock freedom). Not for use outside common/schedule.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/schedule/action.h"
#include "common/schedule/validator.h"

namespace stagecoach::schedule::internal {

// "1F3" and the like.
std::string ActionName(int stage, ActionType type, int mb);

// Attaches "rank" or "rank,step" to `status` (read back by ErrorLocation).
absl::Status WithLocation(absl::Status status, size_t rank, std::optional<size_t> step);

// Builds INVALID_ARGUMENT errors that end with the schedule's grid, as PyTorch's do.
class Reporter {
 public:
  explicit Reporter(const PipelineOrder& order) : order_(order) {}

  absl::Status AtStep(size_t rank, size_t step, absl::string_view what) const {
    return WithLocation(
        absl::InvalidArgumentError(absl::StrCat("Rank ", rank, ", step ", step, ": ", what,
                                                "\n\nFull pipeline schedule:\n",
                                                FormatGrid(order_, static_cast<int>(step)))),
        rank, step);
  }

  // An error about the whole schedule, or (with `rank`) about a stage that rank holds.
  absl::Status Whole(absl::string_view what, int rank = -1) const {
    absl::Status status = absl::InvalidArgumentError(
        absl::StrCat(what, "\n\nFull pipeline schedule:\n", FormatGrid(order_)));
    if (rank >= 0) status = WithLocation(std::move(status), rank, std::nullopt);
    return status;
  }

 private:
  const PipelineOrder& order_;
};

// A lowered schedule's send/recv rules, given that its compute rules and stage placement hold
// (every action of stage s on rank stage_to_rank[s], indices in range). INVALID_ARGUMENT with
// the location and grid.
absl::Status CheckComms(const PipelineOrder& order, const std::vector<int>& stage_to_rank,
                        int num_microbatches);

// OK when the lowered schedule runs to its end with SEND and RECV never blocking and each
// consumer waiting for its producer; else INVALID_ARGUMENT "deadlock: ..." naming where every
// rank is stuck.
absl::Status CheckDeadlockFree(const PipelineOrder& order, const std::vector<int>& stage_to_rank,
                               int num_microbatches);

}  // namespace stagecoach::schedule::internal
