// The tensors of a Llama-family model (decoder_config.h) under both names they go by: the
// built-in model's (worker/model/llama.h: "embed.weight", "layers.3.self_attn.q_proj.weight",
// "norm.weight", "head.weight") and Hugging Face's ("model.embed_tokens.weight",
// "model.layers.3.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight"), with their
// shapes. Pure functions; no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/hf/decoder_config.h"

namespace stagecoach::hf {

struct DecoderTensor {
  std::string name;     // the built-in model's
  std::string hf_name;  // Hugging Face's
  std::vector<int64_t> shape;
};

// Every tensor of the model in layer order (embed, each layer's, norm, head); a tied model has
// no head tensor (its head is the embedding).
std::vector<DecoderTensor> DecoderTensors(const DecoderConfig& config);

// Hugging Face's name for a built-in name ("layers.0.mlp.up_proj.weight" ->
// "model.layers.0.mlp.up_proj.weight"); nullopt for a name that is not the family's.
std::optional<std::string> HfName(const std::string& name);

}  // namespace stagecoach::hf
