// The built-in Llama family (model.builtin {family: llama, <Hugging Face config.json keys>, seq,
// seed}, and the models of Hugging Face checkpoint directories): one decoder implementation whose
// configuration (common/hf/decoder_config.h) selects what Llama, Mistral, Qwen2 and Qwen3 differ
// in. Its layers, in order, with the names split.points uses:
//   embed     token embedding [vocab_size, hidden_size] ("embed.weight"); int64 token ids
//             [B, T] -> float32 [B, T, H]
//   layers.i  x + attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x)):
//             self_attn.{q,k,v}_proj (biases with qkv_bias), self_attn.o_proj (bias with
//             o_bias), optional self_attn.{q,k}_norm (per-head RMSNorm over head_dim, qk_norm);
//             rotary embeddings on q and k (rope_theta, the llama3 rope_scaling) at positions
//             0 .. T-1; grouped-query attention (query head j reads key/value head
//             j / (num_attention_heads / num_key_value_heads)); causal softmax of q k^T /
//             sqrt(head_dim); mlp.down_proj(silu(mlp.gate_proj(x)) * mlp.up_proj(x)) (biases with
//             mlp_bias); [B, T, H] -> [B, T, H]
//   norm      RMSNorm(hidden_size) ("norm.weight")
//   head      Linear(H, vocab_size) without bias ("head.weight"); [B, T, H] -> logits
// RMSNorm(x) = weight * (x / sqrt(mean(x^2) + rms_norm_eps)), computed in fp32 and cast back to
// x's dtype before the weight, as transformers does. Parameter names are the layer name, ".",
// and the path in the layer, e.g. "layers.3.self_attn.q_proj.weight": Hugging Face's names with
// "model." and "embed_tokens" dropped and lm_head called head (hf_names.h maps them).
//
// T may be at most model.builtin.seq. Under bf16 (precision.h) norms and softmax take fp32.
// tie_word_embeddings: as the GPT's tie_embeddings (gpt.h): one parameter when embed and head
// share a stage, a copy in the head's stage otherwise.
//
// With model.weights_dir (a model given as model.hf) the stage builds only its own layers and
// reads their parameters from the directory's safetensors (hf_weights.h). Otherwise,
// initialisation (a model trained from scratch): LibTorch's generator seeded with model.seed,
// the layers built in order and each parameter, in the order listed above, drawn as
// transformers' _init_weights does: Linear and Embedding weights normal(0, 0.02), biases zero,
// RMSNorm weights one. Every worker builds the layers before and in its stage, so that all
// stages together form one model.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/model/stage_model.h"

namespace stagecoach::model {

// Builds layers [first_layer, end_layer) of the Llama-family model (0 = embed, 1 ..
// num_hidden_layers = layers, then norm, head). INVALID_ARGUMENT for a model that is not of the
// family or a layer range outside it.
absl::StatusOr<std::unique_ptr<StageModel>> BuildLlamaStage(const spec::BuiltinModel& model,
                                                            int first_layer, int end_layer);

}  // namespace stagecoach::model
