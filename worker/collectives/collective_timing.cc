#include "worker/collectives/collective_timing.h"

#include <algorithm>

namespace stagecoach::collectives {

CollectiveOverlap OverlapOf(const std::vector<CollectiveTiming>& timings, absl::Duration waited) {
  CollectiveOverlap out;
  if (timings.empty()) return out;
  absl::Duration first = timings.front().start, last = timings.front().end;
  for (const CollectiveTiming& t : timings) {
    first = std::min(first, t.start);
    last = std::max(last, t.end);
  }
  out.span = last - first;
  if (out.span > absl::ZeroDuration()) {
    out.hidden_ratio =
        std::clamp(1.0 - absl::FDivDuration(std::min(waited, out.span), out.span), 0.0, 1.0);
  }
  return out;
}

}  // namespace stagecoach::collectives
