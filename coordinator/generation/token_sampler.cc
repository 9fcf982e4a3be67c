#include "coordinator/generation/token_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stagecoach::coordinator {
namespace {

constexpr double kMaxTemperature = 100.0;

// Whether logit a ranks before logit b: larger first, NaN last, lower index on ties.
bool RanksBefore(absl::Span<const float> logits, int a, int b) {
  const float x = logits[a], y = logits[b];
  if (std::isnan(x) != std::isnan(y)) return std::isnan(y);
  if (!std::isnan(x) && x != y) return x > y;
  return a < b;
}

}  // namespace

absl::Status ValidateSamplingOptions(const SamplingOptions& options) {
  if (!std::isfinite(options.temperature) || options.temperature < 0 ||
      options.temperature > kMaxTemperature) {
    return absl::InvalidArgumentError(absl::StrCat("temperature: must be in [0, ", kMaxTemperature,
                                                   "] (0 is greedy), got ", options.temperature));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k: must be >= 0 (0 for the whole vocabulary), got ", options.top_k));
  }
  return absl::OkStatus();
}

TokenSampler::TokenSampler(const SamplingOptions& options)
    : options_(options), rng_(options.seed) {}

double TokenSampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int TokenSampler::Next(absl::Span<const float> logits) {
  const int n = static_cast<int>(logits.size());
  if (n == 0) return 0;
  if (options_.temperature == 0.0) {
    int best = 0;
    for (int i = 1; i < n; ++i) {
      if (RanksBefore(logits, i, best)) best = i;
    }
    return best;
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int a, int b) { return RanksBefore(logits, a, b); };
  const int k = options_.top_k == 0 ? n : std::min(options_.top_k, n);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(k);
  if (std::isnan(logits[order[0]])) return 0;
  // softmax(logits / T) over the kept ones, from the largest (order[0]) for stability.
  const double top = logits[order[0]];
  std::vector<double> weights;
  weights.reserve(k);
  double total = 0;
  for (int i : order) {
    const double w =
        std::isnan(logits[i]) ? 0.0 : std::exp((logits[i] - top) / options_.temperature);
    weights.push_back(w);
    total += w;
  }
  const double u = Uniform() * total;
  double acc = 0;
  int last = order[0];  // the last token with a weight: where rounding at the top lands
  for (int j = 0; j < k; ++j) {
    acc += weights[j];
    if (weights[j] > 0) last = order[j];
    if (u < acc) return order[j];
  }
  return last;
}

}  // namespace stagecoach::coordinator
