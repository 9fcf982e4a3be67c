// The numerical contract's reference for the built-in GPT (worker/model/gpt.h's architecture,
// written again here in plain LibTorch from that description, sharing no code with the worker):
// trained in one process without a pipeline from given initial parameters (a job's step-0
// export), on the family's synthetic tokens (worker/runtime/data/training_data.h's definition),
// each step's batch split with tensor_split into microbatches, loss = the mean of the microbatch
// cross-entropies (each the mean over its B x T positions), AdamW, optionally clip_grad_norm_.
// With `tied`, the head uses the token embedding's weight: one parameter.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/reference_documents.h"

namespace stagecoach::testing {

struct GptReferenceConfig {
  int64_t vocab = 0, d_model = 0, layers = 0, heads = 0, seq = 0;
  bool tied = false;
  uint64_t data_seed = 0;
  int64_t batch_size = 0;
  int microbatches = 1;
  int64_t steps = 1;
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 1e-3;
  double momentum = 0.0;  // sgd
  double weight_decay = 0.0;
  std::optional<double> max_norm;
  // Parameter name -> initial value; with `tied`, no "head.weight".
  std::map<std::string, torch::Tensor> initial;
};

struct GptReferenceResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // with max_norm
  std::map<std::string, torch::Tensor> params;  // final, by name (as `initial`)
};

GptReferenceResult TrainGptReference(const GptReferenceConfig& config);

// The small GPT the ragged-data tests train (d_model 16, 2 blocks, 2 heads; SGD with lr 0.1 and
// momentum 0.9) for `vocab` and `seq`, from `initial` (the job's step-0 export).
inline GptReferenceConfig SmallSgdGptReference(int64_t vocab, int64_t seq,
                                               std::map<std::string, torch::Tensor> initial) {
  GptReferenceConfig ref;
  ref.vocab = vocab;
  ref.d_model = 16;
  ref.layers = 2;
  ref.heads = 2;
  ref.seq = seq;
  ref.optimizer = "sgd";
  ref.lr = 0.1;
  ref.momentum = 0.9;
  ref.initial = std::move(initial);
  return ref;
}

// The same model trained on given whole batches instead (reference_documents.h: inputs and
// targets [B, T], targets -100 not counted, segments), each step one unpipelined step on the
// whole batch with the loss normalised by tokens: the sum of every counted position's
// cross-entropy over their count. Every document of a row runs alone, from position 0 (a
// padded row is one document; a packed row several). The config's data fields are not used;
// its optimizer, clipping and initial parameters are.
GptReferenceResult TrainGptReferenceOnBatches(const GptReferenceConfig& config,
                                              const std::vector<DocumentBatch>& batches);

// The loss of the reference model with `params` (by name, as `initial`) over all of `batches`,
// normalised by tokens: the sum of every counted position's cross-entropy (each document alone,
// as TrainGptReferenceOnBatches runs them) over their count. What a validation pass of token
// data reports.
double GptReferenceTokenLoss(const GptReferenceConfig& config,
                             const std::map<std::string, torch::Tensor>& params,
                             const std::vector<DocumentBatch>& batches);

// Greedy decoding by the reference model with `params` (by name, as `initial`; with
// config.tied, no "head.weight" is needed): `n` tokens after `prompt`, each the argmax (lowest
// index on ties) of the last position's logits over the last config.seq tokens so far.
std::vector<int64_t> GreedyGptReference(const GptReferenceConfig& config,
                                        const std::map<std::string, torch::Tensor>& params,
                                        const std::vector<int64_t>& prompt, int n);

}  // namespace stagecoach::testing
