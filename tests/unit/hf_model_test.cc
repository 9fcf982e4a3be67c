// A model given as a Hugging Face checkpoint directory (model.hf), on directories an independent
// writer made (tests/support/hf_llama_ref.py: the standard library, transformers' names): the
// spec reads config.json into a llama model (common/spec/hf_model_spec.h); admission accepts
// exactly the tensors that configuration has and refuses a missing, extra, misshaped or
// integer tensor naming it (coordinator/lifecycle/hf_weights_check.h); a stage built from it
// holds the stored values (BF16 widened exactly) and reads only its own tensors' names; and the
// names and shapes the family lists (common/hf/decoder_tensors.h) are the worker's parameters'.
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/hf/decoder_tensors.h"
#include "common/spec/hf_model_spec.h"
#include "coordinator/lifecycle/hf_weights_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/python.h"
#include "tests/support/temp_dir.h"
#include "worker/model/llama.h"

namespace stagecoach::hf_model_test {
namespace {

using ::testing::HasSubstr;

constexpr char kConfig[] =
    R"({"model_type": "qwen2", "vocab_size": 32, "hidden_size": 24, "intermediate_size": 40,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "tie_word_embeddings": true})";

std::string Script() { return testing::TestDataDir() + "/../support/hf_llama_ref.py"; }

// Runs hf_llama_ref.py with `args`; its stdout.
std::string RunRef(std::vector<std::string> args) {
  args.insert(args.begin(), {testing::kPython, Script()});
  const testing::CommandResult result = testing::RunCommand(args, absl::Seconds(60));
  EXPECT_EQ(result.exit_code, 0) << absl::StrJoin(args, " ") << ": " << result.err;
  return result.out;
}

std::string Write(const std::string& dir, const std::string& options = "",
                  const std::string& config = kConfig) {
  std::vector<std::string> args = {"write", dir, config};
  for (absl::string_view o : absl::StrSplit(options, ' ', absl::SkipEmpty())) {
    args.emplace_back(o);
  }
  RunRef(args);
  return dir;
}

absl::StatusOr<spec::JobSpec> Read(const std::string& dir, int seq = 8) {
  return spec::ReadJobSpec(absl::StrCat("name: t\nmodel: {hf: {path: ", dir, ", seq: ", seq,
                                        "}}\nschedule: {kind: 1F1B}\n"
                                        "training: {batch_size: 2, loss: cross_entropy}\n"));
}

std::string Refusal(const std::string& dir) {
  absl::StatusOr<spec::JobSpec> spec = Read(dir);
  if (!spec.ok()) return std::string(spec.status().message());
  absl::Status checked = coordinator::CheckHfWeights(*spec);
  return checked.ok() ? "accepted" : std::string(checked.message());
}

class HfModel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(testing::kPython)) GTEST_SKIP() << testing::kPython;
  }
  testing::TempDir tmp_;
};

TEST_F(HfModel, ConfigBecomesALlamaModelAndItsTensorsAreAccepted) {
  const std::string dir = Write(tmp_.path() + "/m", "--dtype BF16 --shards 3");
  absl::StatusOr<spec::JobSpec> spec = Read(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->model.builtin.has_value());
  const spec::BuiltinModel& b = *spec->model.builtin;
  EXPECT_EQ(b.family, "llama");
  EXPECT_EQ(b.seq, 8);
  EXPECT_EQ(b.weights_dir, dir);
  EXPECT_TRUE(b.tie_embeddings);
  ASSERT_TRUE(b.decoder.has_value());
  EXPECT_TRUE(b.decoder->qkv_bias);
  EXPECT_EQ(Refusal(dir), "accepted");
  // seq defaults to max_position_embeddings and may not pass it.
  auto whole = spec::ReadJobSpec(absl::StrCat(
      "name: t\nmodel: {hf: {path: ", dir,
      "}}\nschedule: {kind: 1F1B}\ntraining: {batch_size: 2, loss: cross_entropy}\n"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->model.builtin->seq, 64);
  EXPECT_THAT(std::string(Read(dir, 65).status().message()),
              HasSubstr("model.hf.seq: must be <= max_position_embeddings"));
}

TEST_F(HfModel, RefusesWhatTheConfigurationDoesNotHaveNamingIt) {
  EXPECT_THAT(Refusal(Write(tmp_.path() + "/drop", "--drop model.layers.1.mlp.up_proj.weight")),
              HasSubstr("has no tensor model.layers.1.mlp.up_proj.weight, which a qwen2 model"));
  EXPECT_THAT(Refusal(Write(tmp_.path() + "/extra", "--extra model.layers.0.self_attn.rotary_emb.inv_freq")),
              HasSubstr("holds tensor model.layers.0.self_attn.rotary_emb.inv_freq, which a qwen2 "
                        "model"));
  EXPECT_THAT(Refusal(Write(tmp_.path() + "/shape", "--reshape model.layers.0.self_attn.k_proj.weight")),
              HasSubstr("tensor model.layers.0.self_attn.k_proj.weight in "));
  EXPECT_THAT(Refusal(Write(tmp_.path() + "/shape", "--reshape model.layers.0.self_attn.k_proj.weight")),
              HasSubstr("has shape [13, 24]; a qwen2 model of "));
  // A tied model's checkpoint with a head of its own.
  std::string untied = kConfig;
  untied.replace(untied.find("true"), 4, "false");
  const std::string with_head = Write(tmp_.path() + "/head", "", untied);
  std::FILE* f = std::fopen((with_head + "/config.json").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(kConfig, f);
  std::fclose(f);
  EXPECT_THAT(Refusal(with_head), HasSubstr("lm_head.weight, which a qwen2 model"));
  EXPECT_THAT(Refusal(with_head), HasSubstr("tie_word_embeddings makes the head the embedding"));
  // Another architecture, and no directory at all.
  const std::string gemma = Write(tmp_.path() + "/gemma", "",
                                  R"({"model_type": "qwen2", "vocab_size": 32, "hidden_size": 24,
                                      "intermediate_size": 40, "num_hidden_layers": 1,
                                      "num_attention_heads": 4})");
  f = std::fopen((gemma + "/config.json").c_str(), "w");
  std::fputs(R"({"model_type": "gemma2"})", f);
  std::fclose(f);
  EXPECT_THAT(Refusal(gemma), HasSubstr("model_type 'gemma2' is not supported"));
  EXPECT_THAT(Refusal(tmp_.path() + "/none"), HasSubstr("model.hf: "));
  EXPECT_THAT(Refusal(tmp_.path() + "/none"), HasSubstr("/none/config.json cannot be read"));
}

TEST_F(HfModel, AStageHoldsTheStoredValuesAndTheFamilysNamesAreTheWorkers) {
  const std::string dir = Write(tmp_.path() + "/m", "--dtype BF16 --shards 2 --seed 3");
  absl::StatusOr<spec::JobSpec> spec = Read(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const spec::BuiltinModel& b = *spec->model.builtin;
  // The last two layers (norm, head): the head is a copy of the stored embedding.
  auto tail = model::BuildLlamaStage(b, 3, 5);
  ASSERT_TRUE(tail.ok()) << tail.status();
  std::map<std::string, torch::Tensor> params;
  for (auto& [name, p] : (*tail)->NamedParameters()) params[name] = p;
  ASSERT_EQ(params.size(), 2u);
  auto stored = [&](const std::string& name) {
    std::vector<float> values;
    for (absl::string_view line : absl::StrSplit(RunRef({"values", dir, name}), '\n',
                                                 absl::SkipEmpty())) {
      values.push_back(std::stof(std::string(line)));
    }
    return torch::tensor(values);
  };
  EXPECT_TRUE(torch::equal(params["norm.weight"], stored("model.norm.weight")));
  EXPECT_TRUE(torch::equal(params["head.weight"].flatten(), stored("model.embed_tokens.weight")));
  auto first = model::BuildLlamaStage(b, 0, 2);
  ASSERT_TRUE(first.ok()) << first.status();
  for (auto& [name, p] : (*first)->NamedParameters()) {
    if (name == "layers.0.self_attn.q_proj.bias") {
      EXPECT_TRUE(torch::equal(p, stored("model.layers.0.self_attn.q_proj.bias")));
    }
  }

  // Every tensor the family lists is a worker parameter of that shape, and the other way round.
  auto whole = model::BuildLlamaStage(b, 0, 5);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::map<std::string, std::vector<int64_t>> worker;
  for (auto& [name, p] : (*whole)->NamedParameters()) worker[name] = p.sizes().vec();
  std::map<std::string, std::vector<int64_t>> listed;
  for (const hf::DecoderTensor& t : hf::DecoderTensors(*b.decoder)) listed[t.name] = t.shape;
  EXPECT_EQ(worker, listed);
}

}  // namespace
}  // namespace stagecoach::hf_model_test
