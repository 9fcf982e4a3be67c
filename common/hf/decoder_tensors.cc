#include "common/hf/decoder_tensors.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace stagecoach::hf {

std::vector<DecoderTensor> DecoderTensors(const DecoderConfig& c) {
  std::vector<DecoderTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    std::string hf_name = *HfName(name);
    out.push_back({std::move(name), std::move(hf_name), std::move(shape)});
  };
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  add("embed.weight", {c.vocab_size, h});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = absl::StrCat("layers.", i, ".");
    add(l + "input_layernorm.weight", {h});
    const struct {
      const char* name;
      int64_t out, in;
      bool bias;
    } linears[] = {{"self_attn.q_proj", q, h, c.qkv_bias},
                   {"self_attn.k_proj", kv, h, c.qkv_bias},
                   {"self_attn.v_proj", kv, h, c.qkv_bias},
                   {"self_attn.o_proj", h, q, c.o_bias}};
    for (const auto& lin : linears) {
      add(absl::StrCat(l, lin.name, ".weight"), {lin.out, lin.in});
      if (lin.bias) add(absl::StrCat(l, lin.name, ".bias"), {lin.out});
    }
    if (c.qk_norm) {
      add(l + "self_attn.q_norm.weight", {c.head_dim});
      add(l + "self_attn.k_norm.weight", {c.head_dim});
    }
    add(l + "post_attention_layernorm.weight", {h});
    const struct {
      const char* name;
      int64_t out, in;
    } mlp[] = {{"mlp.gate_proj", inter, h}, {"mlp.up_proj", inter, h}, {"mlp.down_proj", h, inter}};
    for (const auto& lin : mlp) {
      add(absl::StrCat(l, lin.name, ".weight"), {lin.out, lin.in});
      if (c.mlp_bias) add(absl::StrCat(l, lin.name, ".bias"), {lin.out});
    }
  }
  add("norm.weight", {h});
  if (!c.tie_word_embeddings) add("head.weight", {c.vocab_size, h});
  return out;
}

std::optional<std::string> HfName(const std::string& name) {
  if (name == "embed.weight") return std::string("model.embed_tokens.weight");
  if (name == "norm.weight") return std::string("model.norm.weight");
  if (name == "head.weight") return std::string("lm_head.weight");
  if (absl::StartsWith(name, "layers.")) return absl::StrCat("model.", name);
  return std::nullopt;
}

}  // namespace stagecoach::hf
