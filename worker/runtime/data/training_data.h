// Where a step's batch comes from (data.kind), and how it is split into microbatches.
//
// data.kind: synthetic, for a built-in MLP with sizes [in, ..., out] — drawn from data.seed and
// the step number only, so that every schedule and placement sees the same data:
//   teacher  W = randn([in, out], generator(seed)) / sqrt(in)
//   step k   X = randn([batch_size, in], generator(seed + 1 + k))
//   targets  mse: tanh(X @ W)   cross_entropy: argmax(X @ W, dim 1) (int64 class indices)
// where generator(s) is LibTorch's CPU generator seeded with s, and all tensors are float32.
// A fixed teacher makes the task learnable, so the loss falls as training goes on.
//
// data.kind: synthetic, for a built-in GPT — row r of step k is an arithmetic sequence modulo
// the vocabulary V: start_r = randint(0, V), stride_r = randint(1, V), both drawn (per row, starts
// first) from generator(seed + 1 + k); tokens t_i = (start_r + i * stride_r) mod V for i in
// [0, T]; inputs t[0:T], targets t[1:T+1]. Learnable: a token follows from the two before it.
//
// data.kind: tokens, for a built-in GPT with sequence length T = model.builtin.seq (or a
// TorchScript model with T = data.seq, any uint16 token) — data.path is
// a flat little-endian uint16 token file (nanoGPT's train.bin) of N tokens, all below
// model.builtin.vocab, N >= T + 1. Step k's batch is batch_size windows of T + 1 tokens:
//   starts   randint(0, N - T, [batch_size], generator(seed + 1 + k))   (int64, in [0, N - T - 1])
//   inputs   tokens[start : start + T]        int64 [batch_size, T]
//   targets  tokens[start + 1 : start + T + 1] int64 [batch_size, T]
// The file is read once, when the source is opened.
//
// data.kind: tensors, for a built-in MLP with sizes [in, ..., out] or a TorchScript model —
// data.path is a file written by torch.save({"inputs": X, "targets": Y}) (PyTorch's zip format),
// read once when the source is opened: X is [N, in] of any real dtype (converted to float32), N >=
// 1; Y has N rows too:
//   cross_entropy  integer class indices [N] in [0, out)  (converted to int64)
//   mse            floating point [N, out]                (converted to float32)
// For a TorchScript model X is [N, ...] of any real dtype (floating point converted to float32,
// integers to int64 ids) and Y has N rows: integers (int64) for cross_entropy, floating point
// (float32) for mse.
// Step k's batch is rows (k * batch_size + i) mod N for i in [0, batch_size), wrapping around.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace stagecoach::runtime {

struct Batch {
  torch::Tensor inputs;   // undefined unless asked for
  torch::Tensor targets;  // undefined unless asked for
  // Rows of documents (data.packing, document_rows.h): the positions each row holds, int64 [B]
  // (its microbatch runs padded to its longest row), and with pack each position's document
  // within its row, int64 [B, T]; undefined otherwise.
  torch::Tensor row_lengths;
  torch::Tensor segments;
};

// A job's data stream, opened once per task. Not thread-safe.
class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // Opens the stream of `spec` for a rank that needs inputs (owns the first stage) and/or
  // targets (owns the last). A rank needing neither gets a source that reads nothing and
  // returns empty batches, except with packed rows (data.packing: pack), whose segments every
  // rank needs. INVALID_ARGUMENT naming the field for a data kind or model it cannot
  // serve, a bad tokens file (unreadable, odd byte count, shorter than seq + 1 tokens, a
  // token >= vocab) or a bad tensors file (unreadable, not a torch.save'd dict, a missing
  // "inputs"/"targets" key or a non-tensor under it, no rows, row counts that differ, inputs
  // not [N, sizes[0]], targets that do not fit training.loss).
  static absl::StatusOr<std::unique_ptr<BatchSource>> Open(const spec::JobSpec& spec,
                                                           bool want_inputs, bool want_targets);

  // The batch of training step `step`, holding what Open was asked for.
  virtual absl::StatusOr<Batch> Make(int64_t step) = 0;

  // What a source of records (data.kind jsonl) made of its file: records read, and how many of
  // them were longer than the window and truncated or skipped (data.overlong). Zeros otherwise.
  struct Records {
    int64_t read = 0, truncated = 0, skipped = 0;
  };
  virtual Records records() const { return {}; }
};

// The batch of training step `step` (opens a BatchSource for the one step). Only the first stage
// needs inputs and only the last targets; ask for what is needed. INVALID_ARGUMENT for a data kind
// or model it cannot serve.
absl::StatusOr<Batch> MakeBatch(const spec::JobSpec& spec, int64_t step, bool want_inputs,
                                bool want_targets);

// Splits `batch` along dimension 0 into `n` microbatches like torch.tensor_split: sizes differ
// by at most one, the larger ones first. Requires 1 <= n <= batch.size(0).
std::vector<torch::Tensor> SplitMicrobatches(const torch::Tensor& batch, int n);

// Positions per row: model.builtin.seq for a built-in decoder (gpt, llama), data.seq for a
// TorchScript model.
int64_t WindowLength(const spec::JobSpec& spec);

// Which of a job's data-parallel replicas a task belongs to (placement.replicas).
struct ReplicaShare {
  int replica = 0;
  int replicas = 1;
};

// The `m` microbatches replica share.replica runs of a global batch: the batch is split into
// share.replicas * m microbatches (SplitMicrobatches) and the replica takes
// [replica * m, (replica + 1) * m). Requires share.replicas * m <= batch.size(0).
std::vector<torch::Tensor> ReplicaMicrobatches(const torch::Tensor& batch, int m,
                                               const ReplicaShare& share);

}  // namespace stagecoach::runtime
