// The numerical contract's reference for the Llama family (worker/model/llama.h's architecture,
// written again here in plain LibTorch from transformers' description of LlamaForCausalLM,
// Qwen2 and Qwen3, sharing no code with the worker): trained in one process without a pipeline
// from given initial parameters (a job's step-0 checkpoint), on the decoders' synthetic tokens
// (reference_common.h), each step's batch split with tensor_split into microbatches, loss = the
// mean of the microbatch cross-entropies, SGD or AdamW, optionally clip_grad_norm_.
//
// bf16: the forward under LibTorch's CPU autocast to bf16, and the hidden state cast to bf16
// after each layer in `wire_after` (where the pipeline's stages end, as its executor sends bf16
// between stages); logits in fp32 for the loss.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace stagecoach::testing {

struct LlamaReferenceConfig {
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0,
          head_dim = 0, seq = 0;
  double eps = 1e-6, theta = 10000.0;
  // rope_scaling {rope_type: llama3}.
  struct Llama3 {
    double factor = 8, low_freq_factor = 1, high_freq_factor = 4;
    int64_t original_max_position_embeddings = 8192;
  };
  std::optional<Llama3> llama3;
  bool tied = false, qkv_bias = false, o_bias = false, qk_norm = false;
  bool bf16 = false;
  std::vector<int> wire_after;  // layer indices: 0 embed, 1..layers decoder layers, then norm
  uint64_t data_seed = 0;
  int64_t batch_size = 0;
  int microbatches = 1;
  int64_t steps = 1;
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 1e-3;
  double momentum = 0.0;  // sgd
  double weight_decay = 0.0;
  std::optional<double> max_norm;
  // Parameter name (llama.h's) -> initial value; with `tied`, no "head.weight".
  std::map<std::string, torch::Tensor> initial;
};

struct LlamaReferenceResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;               // with max_norm
  std::map<std::string, torch::Tensor> params;  // final, by name (as `initial`)
};

LlamaReferenceResult TrainLlamaReference(const LlamaReferenceConfig& config);

// The reference's logits [B, T, vocab] for `tokens` [B, T] with `params` (fp32, no autocast).
torch::Tensor LlamaReferenceLogits(const LlamaReferenceConfig& config,
                                   const std::map<std::string, torch::Tensor>& params,
                                   const torch::Tensor& tokens);

// Greedy decoding without a cache: each of the `n` tokens is the argmax (lowest index on ties)
// of the reference's logits at the last position of the context (prompt + tokens so far), or of
// its last `max_positions` tokens when it is longer (a sliding window).
std::vector<int64_t> GreedyLlamaReference(const LlamaReferenceConfig& config,
                                          const std::map<std::string, torch::Tensor>& params,
                                          const std::vector<int64_t>& prompt, int n,
                                          int64_t max_positions);

}  // namespace stagecoach::testing
