// Hugging Face decoder configurations (common/hf/decoder_config.h): the config.json files of
// published models of each model_type (Llama 3.2 1B, Mistral 7B v0.1, Qwen2.5 0.5B, Qwen3 0.6B)
// parse to their published parameter counts; what we write reads back the same; bad
// configurations are refused naming the key.
#include "common/hf/decoder_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::hf::decoder_config_test {
namespace {

using ::testing::HasSubstr;

constexpr char kLlama32_1B[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 128256})";

constexpr char kMistral7B[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 32000})";

constexpr char kQwen25_05B[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kQwen3_06B[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

DecoderConfig MustParse(const std::string& text) {
  auto config = ParseDecoderConfig(text, "config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DecoderConfig{};
}

TEST(HfDecoderConfig, PublishedModelsHaveTheirPublishedParameterCounts) {
  const DecoderConfig llama = MustParse(kLlama32_1B);
  EXPECT_EQ(llama.NumParameters(), 1235814400);
  EXPECT_EQ(llama.head_dim, 64);
  EXPECT_EQ(llama.num_key_value_heads, 8);
  ASSERT_TRUE(llama.rope_scaling.has_value());
  EXPECT_EQ(llama.rope_scaling->factor, 32.0);
  EXPECT_EQ(llama.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(llama.rope_theta, 500000.0);
  EXPECT_EQ(llama.rms_norm_eps, 1e-5);
  EXPECT_TRUE(llama.tie_word_embeddings);
  EXPECT_FALSE(llama.qkv_bias || llama.o_bias || llama.qk_norm);
  EXPECT_EQ(llama.bos_token_id, 128000);
  EXPECT_EQ(llama.torch_dtype, "bfloat16");

  const DecoderConfig mistral = MustParse(kMistral7B);
  EXPECT_EQ(mistral.NumParameters(), 7241732096);
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_FALSE(mistral.tie_word_embeddings);

  const DecoderConfig qwen2 = MustParse(kQwen25_05B);
  EXPECT_EQ(qwen2.NumParameters(), 494032768);
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.o_bias);
  EXPECT_EQ(qwen2.sliding_window, std::nullopt);  // use_sliding_window is off

  const DecoderConfig qwen3 = MustParse(kQwen3_06B);
  EXPECT_EQ(qwen3.NumParameters(), 596049920);
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim, 128);  // not 1024 / 16
  EXPECT_FALSE(qwen3.rope_scaling.has_value());
}

TEST(HfDecoderConfig, LeftOutKeysTakeTransformersDefaults) {
  const DecoderConfig llama = MustParse(R"({"model_type": "llama", "hidden_size": 64,
      "num_attention_heads": 4, "intermediate_size": 128, "num_hidden_layers": 2})");
  EXPECT_EQ(llama.num_key_value_heads, 4);
  EXPECT_EQ(llama.head_dim, 16);
  EXPECT_EQ(llama.vocab_size, 32000);
  EXPECT_EQ(llama.max_position_embeddings, 2048);
  EXPECT_EQ(llama.rope_theta, 10000.0);
  EXPECT_EQ(llama.rms_norm_eps, 1e-6);
  const DecoderConfig qwen3 = MustParse(R"({"model_type": "qwen3", "hidden_size": 64,
      "num_attention_heads": 4})");
  EXPECT_EQ(qwen3.head_dim, 128);  // Qwen3Config's default
  const DecoderConfig mistral = MustParse(R"({"model_type": "mistral"})");
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_EQ(mistral.num_key_value_heads, 8);
  // attention_bias switches on every projection's bias in llama and qwen3, none in mistral.
  const DecoderConfig biased = MustParse(R"({"model_type": "llama", "attention_bias": true,
      "mlp_bias": true})");
  EXPECT_TRUE(biased.qkv_bias && biased.o_bias && biased.mlp_bias);
  const DecoderConfig mistral_bias = MustParse(R"({"model_type": "mistral",
      "attention_bias": true})");
  EXPECT_FALSE(mistral_bias.qkv_bias || mistral_bias.o_bias);
  // "type" is rope_scaling's older spelling of "rope_type".
  const DecoderConfig legacy = MustParse(R"({"model_type": "llama",
      "rope_scaling": {"type": "llama3", "factor": 8.0}})");
  ASSERT_TRUE(legacy.rope_scaling.has_value());
  EXPECT_EQ(legacy.rope_scaling->factor, 8.0);
  EXPECT_EQ(legacy.rope_scaling->high_freq_factor, 4.0);
}

TEST(HfDecoderConfig, WhatWeWriteReadsBackTheSame) {
  for (const char* text : {kLlama32_1B, kMistral7B, kQwen25_05B, kQwen3_06B}) {
    const DecoderConfig a = MustParse(text);
    SCOPED_TRACE(a.model_type);
    const std::string written = DecoderConfigJson(a);
    const DecoderConfig b = MustParse(written);
    EXPECT_EQ(b.model_type, a.model_type);
    EXPECT_EQ(b.NumParameters(), a.NumParameters());
    EXPECT_EQ(b.head_dim, a.head_dim);
    EXPECT_EQ(b.num_key_value_heads, a.num_key_value_heads);
    EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
    EXPECT_EQ(b.rms_norm_eps, a.rms_norm_eps);
    EXPECT_EQ(b.rope_theta, a.rope_theta);
    EXPECT_EQ(b.rope_scaling.has_value(), a.rope_scaling.has_value());
    EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
    EXPECT_EQ(b.qkv_bias, a.qkv_bias);
    EXPECT_EQ(b.o_bias, a.o_bias);
    EXPECT_EQ(b.qk_norm, a.qk_norm);
    EXPECT_EQ(b.sliding_window, a.sliding_window);
    EXPECT_EQ(b.eos_token_id, a.eos_token_id);
    EXPECT_EQ(b.torch_dtype, a.torch_dtype);
  }
  EXPECT_THAT(DecoderConfigJson(MustParse(kQwen3_06B)), HasSubstr("\"Qwen3ForCausalLM\""));
}

std::string ErrorOf(const std::string& text) {
  auto config = ParseDecoderConfig(text, "m/config.json");
  EXPECT_FALSE(config.ok()) << text;
  return config.ok() ? "" : std::string(config.status().message());
}

TEST(HfDecoderConfig, RefusesWhatItCannotBuildNamingTheKey) {
  EXPECT_THAT(ErrorOf("[]"), HasSubstr("m/config.json: not a JSON object"));
  EXPECT_THAT(ErrorOf("{}"), HasSubstr("m/config.json: model_type is missing"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "gemma2"})"),
              HasSubstr("model_type 'gemma2' is not supported (llama, mistral, qwen2 or qwen3)"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "hidden_size": 0})"),
              HasSubstr("hidden_size is 0, not a positive integer"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "num_hidden_layers": "2"})"),
              HasSubstr("num_hidden_layers is \"2\", not a positive integer"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "num_attention_heads": 6,
                          "num_key_value_heads": 4})"),
              HasSubstr("num_key_value_heads 4 does not divide num_attention_heads 6"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "hidden_size": 100,
                          "num_attention_heads": 8})"),
              HasSubstr("num_attention_heads 8 does not divide hidden_size 100"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "head_dim": 7})"),
              HasSubstr("head_dim 7 is odd"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "hidden_act": "gelu"})"),
              HasSubstr("hidden_act is \"gelu\": only silu"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "rope_scaling": {"rope_type": "yarn"}})"),
              HasSubstr("rope_scaling of type 'yarn' is not supported"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama",
                          "rope_scaling": {"rope_type": "llama3", "factor": -1}})"),
              HasSubstr("rope_scaling.factor is -1, not a positive number"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3",
                          "low_freq_factor": 4, "high_freq_factor": 1}})"),
              HasSubstr("rope_scaling.high_freq_factor 1 is not above low_freq_factor 4"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "rms_norm_eps": 0})"),
              HasSubstr("rms_norm_eps is 0, not a positive number"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "qwen2", "use_sliding_window": true})"),
              HasSubstr("use_sliding_window is true: sliding-window attention is not supported"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "mistral", "sliding_window": -3})"),
              HasSubstr("sliding_window is -3, not a positive integer or null"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "tie_word_embeddings": 1})"),
              HasSubstr("tie_word_embeddings is 1, not true or false"));
}

}  // namespace
}  // namespace stagecoach::hf::decoder_config_test
