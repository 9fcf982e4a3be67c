// Picking the next token from a GPT's logits for CoordinatorService's generation
// (GenerationService.Generate): greedy at temperature 0, else a draw from the softmax of
// logits / temperature over the top_k largest logits (all when top_k is 0). Deterministic for a
// seed: the same seed, options and logits give the same tokens on every machine, since the
// uniform numbers come from std::mt19937_64 (its output is fixed by the C++ standard) turned
// into doubles here, not by an implementation-defined distribution.
//
// Plain C++ (the coordinator has no LibTorch). Not thread-safe: one sampler per generation.
#pragma once

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace stagecoach::coordinator {

struct SamplingOptions {
  // 0: greedy (the largest logit; the lowest index among equal ones). Else > 0.
  double temperature = 0.0;
  // Sample among the k largest logits only (ties at the k-th value broken by lower index);
  // 0 for all of them.
  int top_k = 0;
  uint64_t seed = 0;
};

// INVALID_ARGUMENT naming `temperature` (negative, not finite, or above 100) or `top_k`
// (negative).
absl::Status ValidateSamplingOptions(const SamplingOptions& options);

class TokenSampler {
 public:
  explicit TokenSampler(const SamplingOptions& options);

  // The next token's index into `logits` (one per vocabulary entry, at least one). A NaN
  // logit never wins; all NaN gives token 0.
  int Next(absl::Span<const float> logits);

 private:
  // A uniform double in [0, 1) from 53 bits of the generator.
  double Uniform();

  SamplingOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace stagecoach::coordinator
