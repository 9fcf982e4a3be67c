// The split search (PartitionBalanced) and planning's interruption check (PlanOptions), declared
// in planner.h.
#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "coordinator/planning/planner.h"

namespace stagecoach::coordinator {

namespace {

// Whether the first `end` layers split into at most `parts` contiguous parts each costing at
// most `bound` (prefix sums in `prefix`). Greedy from the front, each part as long as it can
// be, found by binary search: O(parts x log layers).
bool SplitFits(const std::vector<int64_t>& prefix, int end, int parts, int64_t bound) {
  int start = 0;
  for (int used = 0; start < end; ++used) {
    if (used == parts) return false;
    // The furthest boundary b with prefix[b] - prefix[start] <= bound.
    const auto it = std::upper_bound(prefix.begin() + start + 1, prefix.begin() + end + 1,
                                     prefix[start] + bound);
    const int b = static_cast<int>(it - prefix.begin()) - 1;
    if (b == start) return false;  // one layer costs more than the bound
    start = b;
  }
  return true;
}

// The smallest possible cost of the largest part when the first `end` layers form `parts`
// parts (end >= parts): a binary search over the bound.
int64_t SmallestLargestPart(const std::vector<int64_t>& prefix, int end, int parts) {
  int64_t lo = 0, hi = prefix[end];
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (SplitFits(prefix, end, parts, mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace

absl::Status PlanOptions::Interrupted(absl::string_view phase) const {
  if (cancelled && cancelled()) {
    return absl::CancelledError(
        absl::StrCat("planning abandoned while ", phase, ": its client went away"));
  }
  if (absl::Now() > deadline) {
    return absl::DeadlineExceededError(absl::StrCat(
        "planning ran past its deadline while ", phase,
        " (the coordinator's --plan-timeout); a smaller model or schedule plans faster"));
  }
  return absl::OkStatus();
}

std::vector<int> PartitionBalanced(const std::vector<int64_t>& costs, int stages) {
  return *PartitionBalanced(costs, stages, PlanOptions{});
}

absl::StatusOr<std::vector<int>> PartitionBalanced(const std::vector<int64_t>& costs, int stages,
                                                   const PlanOptions& options) {
  // Costs are non-negative, so the best largest part over the first i layers in k parts never
  // decreases with i, and a part can be split without raising it. Working from the last stage:
  // the smallest possible largest part B of the layers left, then the longest last part costing
  // at most B that leaves at least one layer per earlier stage; its first layer is the
  // smallest j >= k-1 with prefix[i] - prefix[j] <= B. This is the cut the dynamic programme
  // over (stage, layer) makes with its tie rule (earlier stages take fewer layers), in
  // O(stages^2 x log(layers) x log(total cost)) time and O(layers) memory instead of
  // O(stages x layers^2) time and O(stages x layers) memory.
  const int n = static_cast<int>(costs.size());
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    if (__builtin_add_overflow(prefix[i], std::max<int64_t>(0, costs[i]), &prefix[i + 1])) {
      prefix[i + 1] = std::numeric_limits<int64_t>::max();
    }
  }
  std::vector<int> firsts(stages);
  int end = n;
  for (int k = stages; k >= 1; --k) {
    RETURN_IF_ERROR(options.Interrupted("splitting the layers into stages"));
    const int64_t bound = SmallestLargestPart(prefix, end, k);
    const auto it = std::lower_bound(prefix.begin(), prefix.begin() + end + 1, prefix[end] - bound);
    const int j = std::max(k - 1, static_cast<int>(it - prefix.begin()));
    firsts[k - 1] = j;
    end = j;
  }
  return firsts;
}

}  // namespace stagecoach::coordinator
