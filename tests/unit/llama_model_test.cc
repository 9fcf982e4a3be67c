// The built-in Llama family: the spec's keys (common/spec/builtin_fields.h) read as Hugging
// Face's config.json says, the layers and per-layer parameter counts the planner uses
// (common/spec/builtin_model.h), and the worker's stages (worker/model/llama.h): chained stages
// equal the whole model exactly, the parameters carry transformers' names for every model_type's
// switches, the model is causal, and grouped-query attention equals full attention with each
// key/value head repeated for its query heads.
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/llama.h"

namespace stagecoach::llama_model_test {
namespace {

using ::testing::HasSubstr;

std::string Spec(const std::string& builtin) {
  return absl::StrCat("name: t\nmodel:\n  builtin: {family: llama, ", builtin,
                      "}\nschedule: {kind: 1F1B}\ntraining: {batch_size: 2, loss: "
                      "cross_entropy}\n");
}

constexpr char kSmall[] =
    "vocab_size: 40, hidden_size: 16, intermediate_size: 24, num_hidden_layers: 3, "
    "num_attention_heads: 4, num_key_value_heads: 2, seq: 8, seed: 5";

spec::BuiltinModel Parse(const std::string& builtin) {
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpec(Spec(builtin));
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  return *spec->model.builtin;
}

std::string ParseError(const std::string& builtin) {
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpec(Spec(builtin));
  return spec.ok() ? std::string("parsed") : std::string(spec.status().message());
}

std::unique_ptr<model::StageModel> Build(const spec::BuiltinModel& m, int first, int end) {
  auto stage = model::BuildLlamaStage(m, first, end);
  EXPECT_TRUE(stage.ok()) << stage.status();
  return stage.ok() ? *std::move(stage) : nullptr;
}

std::map<std::string, torch::Tensor> Params(model::StageModel& stage) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, p] : stage.NamedParameters()) out[name] = p;
  return out;
}

TEST(LlamaSpec, ReadsTheConfigKeysWithTheirDefaults) {
  const spec::BuiltinModel m = Parse(kSmall);
  ASSERT_TRUE(m.decoder.has_value());
  const hf::DecoderConfig& c = *m.decoder;
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.max_position_embeddings, 8);  // seq when not given
  EXPECT_EQ(m.vocab, 40);
  EXPECT_EQ(m.d_model, 16);
  EXPECT_EQ(m.layers, 3);
  EXPECT_EQ(m.heads, 4);
  EXPECT_EQ(m.seq, 8);
  EXPECT_EQ(m.seed, 5u);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(spec::BuiltinLayerNames(m),
            (std::vector<std::string>{"embed", "layers.0", "layers.1", "layers.2", "norm", "head"}));

  const spec::BuiltinModel q = Parse(absl::StrCat(
      kSmall, ", model_type: qwen3, head_dim: 6, tie_word_embeddings: true, rope_theta: 500.0, "
              "max_position_embeddings: 64, rope_scaling: {rope_type: llama3, factor: 4, "
              "original_max_position_embeddings: 16}"));
  ASSERT_TRUE(q.decoder.has_value());
  EXPECT_TRUE(q.decoder->qk_norm);
  EXPECT_EQ(q.decoder->head_dim, 6);
  EXPECT_TRUE(q.tie_embeddings);
  EXPECT_EQ(q.decoder->rope_theta, 500.0);
  ASSERT_TRUE(q.decoder->rope_scaling.has_value());
  EXPECT_EQ(q.decoder->rope_scaling->factor, 4.0);
  EXPECT_EQ(q.decoder->rope_scaling->original_max_position_embeddings, 16);
  EXPECT_TRUE(Parse(absl::StrCat(kSmall, ", model_type: qwen2")).decoder->qkv_bias);
}

TEST(LlamaSpec, RefusesNamingTheKey) {
  EXPECT_THAT(ParseError("vocab_size: 40, seq: 8"),
              HasSubstr("model.builtin.hidden_size: required for family llama"));
  EXPECT_THAT(ParseError(absl::StrCat(kSmall, ", max_position_embeddings: 4")),
              HasSubstr("model.builtin.seq: must be <= max_position_embeddings (4), got 8"));
  EXPECT_THAT(ParseError("vocab_size: 40, hidden_size: 16, intermediate_size: 24, "
                         "num_hidden_layers: 3, num_attention_heads: 4, num_key_value_heads: 3, "
                         "seq: 8"),
              HasSubstr("num_key_value_heads"));
  EXPECT_THAT(ParseError(absl::StrCat(kSmall, ", d_model: 16")),
              HasSubstr("model.builtin.d_model: not a key of family llama"));
  EXPECT_THAT(ParseError(absl::StrCat(kSmall, ", model_type: gemma")), HasSubstr("model_type"));
  EXPECT_THAT(ParseError(absl::StrCat(kSmall, ", rope_scaling: {rope_type: yarn}")),
              HasSubstr("model.builtin.rope_scaling.rope_type"));
  EXPECT_THAT(ParseError(absl::StrCat(kSmall, ", rms_norm_eps: 0")),
              HasSubstr("model.builtin.rms_norm_eps: must be > 0"));
  EXPECT_THAT(ParseError(absl::StrCat(kSmall, ", model_type: qwen3, mlp_bias: true")),
              HasSubstr("model.builtin.mlp_bias: not a key of model_type qwen3"));
  EXPECT_THAT(ParseError(absl::StrCat(kSmall, ", model_type: qwen2, attention_bias: false")),
              HasSubstr("model.builtin.attention_bias: not a key of model_type qwen2 (q, k and v "
                        "always have biases"));
  EXPECT_THAT(ParseError(absl::StrCat(kSmall, ", model_type: mistral, attention_bias: true")),
              HasSubstr("model.builtin.attention_bias: not a key of model_type mistral"));
}

TEST(LlamaStage, StagesInSequenceEqualTheWholeModel) {
  const spec::BuiltinModel m = Parse(kSmall);
  auto whole = Build(m, 0, 6);
  auto a = Build(m, 0, 2);
  auto b = Build(m, 2, 4);
  auto c = Build(m, 4, 6);
  ASSERT_TRUE(whole && a && b && c);
  torch::manual_seed(1);
  const torch::Tensor x = torch::randint(0, m.vocab, {3, m.seq}, torch::kInt64);
  const torch::Tensor want = whole->Forward(x);
  EXPECT_EQ(want.sizes(), (std::vector<int64_t>{3, m.seq, m.vocab}));
  EXPECT_TRUE(torch::equal(c->Forward(b->Forward(a->Forward(x))), want));
  EXPECT_EQ(whole->Forward(x.slice(1, 0, 5)).sizes(), (std::vector<int64_t>{3, 5, m.vocab}));
  std::map<std::string, torch::Tensor> split;
  for (auto* s : {a.get(), b.get(), c.get()}) split.merge(Params(*s));
  const auto all = Params(*whole);
  ASSERT_EQ(all.size(), split.size());
  for (const auto& [name, p] : all) {
    ASSERT_EQ(split.count(name), 1u) << name;
    EXPECT_TRUE(torch::equal(p, split[name])) << name;
  }
}

TEST(LlamaStage, NamesFollowTransformersForEverySwitch) {
  const spec::BuiltinModel m = Parse(absl::StrCat(
      kSmall, ", model_type: qwen3, attention_bias: true, tie_word_embeddings: true"));
  auto whole = Build(m, 0, 6);
  ASSERT_TRUE(whole);
  std::set<std::string> names;
  for (auto& [name, p] : whole->NamedParameters()) names.insert(name);
  std::set<std::string> want = {"embed.weight", "norm.weight"};  // tied: no head.weight
  for (int i = 0; i < 3; ++i) {
    const std::string l = absl::StrCat("layers.", i, ".");
    for (const char* p : {"input_layernorm.weight", "post_attention_layernorm.weight",
                          "self_attn.q_norm.weight", "self_attn.k_norm.weight"}) {
      want.insert(l + p);
    }
    for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      want.insert(absl::StrCat(l, p, ".weight"));
      // qwen3's attention_bias puts biases on q, k, v and o; its MLP has none.
      if (absl::string_view(p).substr(0, 3) != "mlp") want.insert(absl::StrCat(l, p, ".bias"));
    }
  }
  EXPECT_EQ(names, want);
  // The head alone holds a copy of the embedding's initial values.
  auto head = Build(m, 5, 6);
  ASSERT_TRUE(head);
  auto head_params = Params(*head);
  ASSERT_EQ(head_params.count("head.weight"), 1u);
  EXPECT_TRUE(torch::equal(head_params["head.weight"], Params(*whole)["embed.weight"]));
}

TEST(LlamaStage, ParameterCountsEqualThePlannersAndTheConfigs) {
  for (const std::string extra :
       {"", ", model_type: qwen2", ", model_type: qwen3, head_dim: 6",
        ", attention_bias: true, mlp_bias: true", ", tie_word_embeddings: true"}) {
    SCOPED_TRACE(extra);
    const spec::BuiltinModel m = Parse(absl::StrCat(kSmall, extra));
    absl::StatusOr<std::vector<int64_t>> planned = spec::BuiltinLayerParameterCounts(m);
    ASSERT_TRUE(planned.ok()) << planned.status();
    ASSERT_EQ(planned->size(), 6u);
    int64_t total = 0;
    for (int layer = 0; layer < 6; ++layer) {
      auto stage = Build(m, layer, layer + 1);
      ASSERT_TRUE(stage);
      EXPECT_EQ(stage->ParameterCount(), (*planned)[layer]) << "layer " << layer;
      total += (*planned)[layer];
    }
    // The configuration's count holds a tied weight once; the layers count the head's copy.
    const int64_t head_copy = m.tie_embeddings ? m.vocab * m.d_model : 0;
    EXPECT_EQ(total, m.decoder->NumParameters() + head_copy);
  }
}

TEST(LlamaStage, IsCausalAndGroupedQueryAttentionRepeatsKeyValueHeads) {
  const spec::BuiltinModel m = Parse(kSmall);
  auto whole = Build(m, 0, 6);
  ASSERT_TRUE(whole);
  torch::manual_seed(2);
  const torch::Tensor x = torch::randint(0, m.vocab, {2, m.seq}, torch::kInt64);
  const torch::Tensor y = whole->Forward(x);
  torch::Tensor x2 = x.clone();
  x2.select(1, m.seq - 1).add_(1).remainder_(m.vocab);
  const torch::Tensor y2 = whole->Forward(x2);
  EXPECT_TRUE(torch::equal(y.slice(1, 0, m.seq - 1), y2.slice(1, 0, m.seq - 1)));
  EXPECT_FALSE(torch::equal(y.select(1, m.seq - 1), y2.select(1, m.seq - 1)));

  // The same model with 4 key/value heads, head j's k/v weights those of head j / 2.
  spec::BuiltinModel full = m;
  full.decoder->num_key_value_heads = 4;
  auto mha = Build(full, 0, 6);
  ASSERT_TRUE(mha);
  auto gqa_params = Params(*whole);
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : mha->NamedParameters()) {
      torch::Tensor from = gqa_params.at(name);
      if (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos) {
        from = from.reshape({2, 4, -1}).repeat_interleave(2, 0).reshape(p.sizes());
      }
      p.copy_(from);
    }
  }
  EXPECT_TRUE(torch::allclose(mha->Forward(x), y, 1e-5, 1e-6));
}

TEST(LlamaStage, RefusesALayerRangeOutsideTheModel) {
  const spec::BuiltinModel m = Parse(kSmall);
  EXPECT_FALSE(model::BuildLlamaStage(m, 0, 7).ok());
  EXPECT_FALSE(model::BuildLlamaStage(m, 2, 2).ok());
  spec::BuiltinModel gpt;
  gpt.family = "gpt";
  EXPECT_THAT(std::string(model::BuildLlamaStage(gpt, 0, 1).status().message()),
              HasSubstr("llama"));
}

}  // namespace
}  // namespace stagecoach::llama_model_test
