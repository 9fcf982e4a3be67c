// model.builtin of the job spec, read through yaml_fields (the rules are in spec_parser.h's
// header comment and docs/spec.md):
//   family mlp    sizes, seed;
//   family gpt    vocab, d_model, layers, heads, seq, seed, tie_embeddings;
//   family llama  Hugging Face config.json keys (model_type llama | mistral | qwen2 | qwen3,
//                 default llama; vocab_size, hidden_size, intermediate_size, num_hidden_layers,
//                 num_attention_heads required; num_key_value_heads, head_dim,
//                 max_position_embeddings (default seq), rms_norm_eps, rope_theta,
//                 rope_scaling {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
//                 original_max_position_embeddings}, tie_word_embeddings, attention_bias,
//                 mlp_bias), and seq (the training window, <= max_position_embeddings) and seed.
//                 What the keys mean, their defaults per model_type and the checks between them
//                 are common/hf/decoder_config.h's, so a spec and a config.json say the same.
// Reports every error on the Validator with its path; writes only what it read validly. Not
// thread-safe: one Validator per parse.
#pragma once

#include <yaml-cpp/yaml.h>

#include "common/spec/job_spec.h"
#include "common/spec/yaml_fields.h"

namespace stagecoach::spec::builtin_fields {

void ParseBuiltin(yaml_fields::Validator& v, const YAML::Node& node, BuiltinModel* builtin);

}  // namespace stagecoach::spec::builtin_fields
