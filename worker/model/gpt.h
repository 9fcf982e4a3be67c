// The built-in GPT family (model.builtin {family: gpt, vocab, d_model, layers, heads, seq, seed}):
// a decoder-only transformer. Its layers, in order, with the names split.points uses:
//   embed      token embedding [vocab, d_model] ("embed.tok.weight") plus learned positions
//              [seq, d_model] ("embed.pos.weight"); int64 token ids [B, T] -> float32 [B, T, d]
//   blocks.i   pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x)); causal multi-head
//              self-attention (attn.qkv Linear(d, 3d), attn.proj Linear(d, d)) and an MLP
//              (mlp.fc Linear(d, 4d), GELU, mlp.proj Linear(4d, d)); [B, T, d] -> [B, T, d]
//   norm       LayerNorm(d) ("norm.weight", "norm.bias")
//   head       Linear(d, vocab) without bias ("head.weight"); [B, T, d] -> logits [B, T, vocab]
// T may be at most seq. Parameter names are the layer name, ".", and the parameter's path in the
// layer, e.g. "blocks.3.attn.qkv.weight".
//
// LayerNorm and softmax take fp32 inputs (precision.h's bf16 policy: a bf16 activation is cast
// up first); with fp32 activations that changes nothing.
//
// tie_embeddings: the head's weight is the token embedding's. In a stage holding both, the head
// uses embed.tok.weight itself (one parameter, listed once); a stage holding the head alone has
// "head.weight" as a copy of the embedding's initial values (no draw of its own), which
// worker/runtime/training/tied_parameters.h keeps equal to the first stage's during training.
//
// Initialisation: LibTorch's generator is seeded with model.seed, then the layers are built in
// order (LibTorch's module constructors draw their default init first) and each one's
// parameters, in the order listed above, are then set: Linear and Embedding weights
// normal(0, 0.02), biases zero, LayerNorm weight one and bias zero. Deterministic per seed, but
// not bit-identical to a PyTorch model built the same way. Every worker builds
// the layers before and in its stage, so all stages together form exactly one model.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/model/stage_model.h"

namespace stagecoach::model {

// Builds layers [first_layer, end_layer) of the GPT (layer indices 0 = embed, 1 .. layers =
// blocks, layers + 1 = norm, layers + 2 = head). INVALID_ARGUMENT naming the field for invalid
// sizes (all > 0, d_model divisible by heads) and for a layer range outside the model.
absl::StatusOr<std::unique_ptr<StageModel>> BuildGptStage(const spec::BuiltinModel& model,
                                                          int first_layer, int end_layer);

}  // namespace stagecoach::model
