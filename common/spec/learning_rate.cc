#include "common/spec/learning_rate.h"

#include <algorithm>
#include <cmath>

namespace stagecoach::spec {

double LearningRateAt(const LrScheduleSpec& schedule, double base_lr, int64_t k,
                      int64_t timeline_steps) {
  const int64_t w = std::max<int64_t>(schedule.warmup_steps, 0);
  const int64_t last = std::max<int64_t>(timeline_steps, 1) - 1;  // T - 1
  const bool decays = schedule.kind == "linear" || schedule.kind == "cosine";
  if (decays && k >= last) return schedule.min_lr;
  if (k < w) {
    return base_lr * static_cast<double>(k + 1) / static_cast<double>(w + 1);
  }
  if (!decays) return base_lr;
  // w <= k < T-1, so T-1-w >= 1.
  const double progress = static_cast<double>(k - w) / static_cast<double>(last - w);
  if (schedule.kind == "linear") return base_lr + (schedule.min_lr - base_lr) * progress;
  return schedule.min_lr + (base_lr - schedule.min_lr) * (1.0 + std::cos(M_PI * progress)) / 2.0;
}

}  // namespace stagecoach::spec
