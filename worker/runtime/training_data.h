// Where a step's batch comes from (data.kind), and how it is split into microbatches.
//
// data.kind: synthetic, for a built-in MLP with sizes [in, ..., out] — drawn from data.seed and
// the step number only, so that every schedule and placement sees the same data:
//   teacher  W = randn([in, out], generator(seed)) / sqrt(in)
//   step k   X = randn([batch_size, in], generator(seed + 1 + k))
//   targets  mse: tanh(X @ W)   cross_entropy: argmax(X @ W, dim 1) (int64 class indices)
// where generator(s) is LibTorch's CPU generator seeded with s, and all tensors are float32.
// A fixed teacher makes the task learnable, so the loss falls as training goes on.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace stagecoach::runtime {

struct Batch {
  torch::Tensor inputs;   // undefined unless asked for
  torch::Tensor targets;  // undefined unless asked for
};

// The batch of training step `step`. Only the first stage needs inputs and only the last
// targets; ask for what is needed. INVALID_ARGUMENT for a data kind or model it cannot serve.
absl::StatusOr<Batch> MakeBatch(const spec::JobSpec& spec, int64_t step, bool want_inputs,
                                bool want_targets);

// Splits `batch` along dimension 0 into `n` microbatches like torch.tensor_split: sizes differ
// by at most one, the larger ones first. Requires 1 <= n <= batch.size(0).
std::vector<torch::Tensor> SplitMicrobatches(const torch::Tensor& batch, int n);

}  // namespace stagecoach::runtime
