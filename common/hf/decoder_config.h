// A Hugging Face decoder's config.json, for the Llama family: `model_type` llama, mistral, qwen2
// and qwen3, which share one architecture (RMSNorm, rotary embeddings, grouped-query attention,
// a SwiGLU MLP) and differ in what their configuration switches on:
//   llama    q/k/v/o biases with attention_bias (default off), the llama3 form of rope_scaling;
//   mistral  no biases; sliding_window (null in current releases);
//   qwen2    q/k/v biases always, none on o; use_sliding_window must be off;
//   qwen3    per-head RMSNorm of q and k; q/k/v/o biases with attention_bias; head_dim (default
//            128, not hidden_size / num_attention_heads).
// Keys a file leaves out take the defaults of transformers' config class for its model_type.
// ParseDecoderConfig refuses, naming the file and the key: another model_type (or none), a size
// that is not a positive integer, heads that do not divide, an odd head_dim, an activation other than silu, a rope_scaling
// other than llama3 (or "default"), and sliding-window attention that would apply.
// DecoderConfigJson writes the config.json that transformers' from_pretrained reads back to the
// same model. Pure functions; thread-safe; no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::hf {

// rope_scaling {"rope_type": "llama3", ...} (Llama 3.1 and later): the rotary frequencies of
// wavelengths past original_max_position_embeddings / low_freq_factor are divided by `factor`,
// those under original_max_position_embeddings / high_freq_factor kept, and those between
// interpolated.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct DecoderConfig {
  std::string model_type;  // llama, mistral, qwen2 or qwen3
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // divides num_attention_heads
  int64_t head_dim = 0;             // per head, for q, k and v
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // q_proj, k_proj and v_proj have biases
  bool o_bias = false;    // o_proj has a bias
  bool mlp_bias = false;  // gate_proj, up_proj and down_proj have biases (llama's mlp_bias)
  bool qk_norm = false;   // per-head RMSNorm of q and k before the rotation (qwen3)
  // mistral's sliding_window: attention sees at most this many positions back. Kept so that a
  // model can refuse a training window longer than it; nullopt when null.
  std::optional<int64_t> sliding_window;
  // torch_dtype as given ("bfloat16", "float32", ...); empty when absent.
  std::string torch_dtype;
  // bos_token_id and eos_token_id when they are single integers.
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;

  // The number of parameters of the model this configuration describes.
  int64_t NumParameters() const;
};

// Parses config.json's text. INVALID_ARGUMENT naming `file_name` and the key (see above).
absl::StatusOr<DecoderConfig> ParseDecoderConfig(absl::string_view text,
                                                 absl::string_view file_name);

// The config.json for `config` ("architectures", "model_type" and every key above), indented.
std::string DecoderConfigJson(const DecoderConfig& config);

}  // namespace stagecoach::hf
