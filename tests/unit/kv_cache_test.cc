// Cached decoding (worker/model/kv_cache.h, LayerChainStage::ForwardCached) and a task's
// generation sessions (worker/runtime/generation/decode_sessions.h): for the built-in GPT and
// Llama-family stages (grouped-query attention, q/k norms, llama3 rope scaling), a prefill of
// ragged rows followed by one-position steps gives the logits the stage computes on each row's
// whole context, within float32 rounding; a stage cut in two passes its outputs on. Sessions
// refuse requests that do not fit them, naming the field, and free their caches at End, Clear
// and after the idle timeout; a cache grows with the positions reached, never past the bound.
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/gpt.h"
#include "worker/model/layer_chain.h"
#include "worker/model/llama.h"
#include "worker/model/mlp.h"
#include "worker/runtime/generation/decode_sessions.h"

namespace stagecoach::kv_cache_test {
namespace {

using ::testing::HasSubstr;

spec::BuiltinModel Parse(const std::string& builtin) {
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpec(absl::StrCat(
      "name: t\nmodel:\n  builtin: {", builtin,
      "}\nschedule: {kind: 1F1B}\ntraining: {batch_size: 2, loss: cross_entropy}\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec->model.builtin : spec::BuiltinModel{};
}

spec::BuiltinModel Gpt() {
  return Parse("family: gpt, vocab: 30, d_model: 16, layers: 2, heads: 4, seq: 24, seed: 2");
}

spec::BuiltinModel Llama() {
  return Parse(
      "family: llama, vocab_size: 30, hidden_size: 16, intermediate_size: 24, "
      "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, seq: 24, seed: 3, "
      "max_position_embeddings: 32, model_type: qwen3, head_dim: 6, rope_scaling: {rope_type: "
      "llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
      "original_max_position_embeddings: 8}");
}

int LayerCount(const spec::BuiltinModel& m) {
  return static_cast<int>((m.family == "gpt" ? m.layers : m.decoder->num_hidden_layers) + 3);
}

std::unique_ptr<model::StageModel> Build(const spec::BuiltinModel& m, int first, int end) {
  auto stage = m.family == "gpt" ? model::BuildGptStage(m, first, end)
                                 : model::BuildLlamaStage(m, first, end);
  EXPECT_TRUE(stage.ok()) << stage.status();
  return stage.ok() ? *std::move(stage) : nullptr;
}

// The logits of `context` at its last position, by the stage's plain forward.
torch::Tensor Uncached(model::StageModel& stage, const std::vector<int64_t>& context) {
  torch::NoGradGuard no_grad;
  return stage.Forward(torch::tensor(context, torch::kInt64).unsqueeze(0))[0][-1];
}

class CachedDecoding : public ::testing::TestWithParam<std::string> {
 protected:
  spec::BuiltinModel Model() const { return GetParam() == "gpt" ? Gpt() : Llama(); }
};

// Rows of 5, 2 and 7 tokens prefilled together where their lengths agree, then 10 steps of one
// new position per row; the logits equal the uncached forward of each row's context.
TEST_P(CachedDecoding, PrefillAndStepsEqualTheWholeContextsForward) {
  const spec::BuiltinModel m = Model();
  auto whole = Build(m, 0, LayerCount(m));
  auto* chain = dynamic_cast<model::LayerChainStage*>(whole.get());
  ASSERT_NE(chain, nullptr);
  std::vector<std::vector<int64_t>> rows = {{1, 2, 3, 4, 5}, {7, 8}, {9, 1, 9, 2, 9, 3, 9}};
  model::StageKv kv;
  torch::NoGradGuard no_grad;
  std::vector<int64_t> held(rows.size(), 0);
  for (int step = 0; step < 11; ++step) {
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<int64_t> fresh(rows[r].begin() + held[r], rows[r].end());
      const model::DecodePositions at = model::DecodePositions::Make(
          {static_cast<int64_t>(r)}, {held[r]}, static_cast<int64_t>(fresh.size()), 3, 24,
          torch::kCPU);
      const torch::Tensor out =
          chain->ForwardCached(torch::tensor(fresh, torch::kInt64).unsqueeze(0), at, kv);
      held[r] = static_cast<int64_t>(rows[r].size());
      const torch::Tensor want = Uncached(*whole, rows[r]);
      EXPECT_TRUE(torch::allclose(out[0][-1], want, 1e-5, 1e-5))
          << "row " << r << " step " << step << ": max diff "
          << (out[0][-1] - want).abs().max().item<float>();
      rows[r].push_back(out[0][-1].argmax().item<int64_t>());
    }
  }
  EXPECT_GT(kv.bytes(), 0);
}

// Two rows stepped together at different positions (one new position each), on a model cut in
// two stages whose caches are separate.
TEST_P(CachedDecoding, RowsAtDifferentPositionsStepTogetherAcrossTwoStages) {
  const spec::BuiltinModel m = Model();
  auto whole = Build(m, 0, LayerCount(m));
  auto first = Build(m, 0, 2);
  auto second = Build(m, 2, LayerCount(m));
  auto* a = dynamic_cast<model::LayerChainStage*>(first.get());
  auto* b = dynamic_cast<model::LayerChainStage*>(second.get());
  model::StageKv kv_a, kv_b;
  torch::NoGradGuard no_grad;
  auto run = [&](const std::vector<int64_t>& rows, const std::vector<int64_t>& starts,
                 const torch::Tensor& ids) {
    const model::DecodePositions at =
        model::DecodePositions::Make(rows, starts, ids.size(1), 2, 24, torch::kCPU);
    return b->ForwardCached(a->ForwardCached(ids, at, kv_a), at, kv_b);
  };
  std::vector<std::vector<int64_t>> ctx = {{3, 4, 5, 6, 7, 8}, {11, 12}};
  run({0}, {0}, torch::tensor(ctx[0], torch::kInt64).unsqueeze(0));
  run({1}, {0}, torch::tensor(ctx[1], torch::kInt64).unsqueeze(0));
  for (int step = 0; step < 4; ++step) {
    ctx[0].push_back(step + 1);
    ctx[1].push_back(step + 20);
    const torch::Tensor out =
        run({0, 1}, {static_cast<int64_t>(ctx[0].size()) - 1, static_cast<int64_t>(ctx[1].size()) - 1},
            torch::tensor({ctx[0].back(), ctx[1].back()}, torch::kInt64).view({2, 1}));
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(torch::allclose(out[r][0], Uncached(*whole, ctx[r]), 1e-5, 1e-5))
          << "row " << r << " step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CachedDecoding, ::testing::Values("gpt", "llama"));

runtime::DecodeStepRequest Request(int stage, std::vector<int64_t> rows,
                                   std::vector<int64_t> starts, torch::Tensor inputs) {
  runtime::DecodeStepRequest r;
  r.session = "s1";
  r.stage = stage;
  r.session_rows = 2;
  r.max_positions = 24;
  r.rows = std::move(rows);
  r.starts = std::move(starts);
  r.inputs = std::move(inputs);
  r.last_position_only = true;
  return r;
}

std::string ErrorOf(runtime::DecodeSessions& sessions, const runtime::DecodeStepRequest& r,
                    model::StageModel& stage) {
  auto out = sessions.Run(r, stage, model::Precision::kFp32, torch::kCPU);
  return out.ok() ? std::string("ran") : std::string(out.status().message());
}

TEST(DecodeSessions, RefuseRequestsThatDoNotFitTheSessionNamingTheField) {
  const spec::BuiltinModel m = Gpt();
  auto stage = Build(m, 0, LayerCount(m));
  runtime::DecodeSessions sessions;
  const torch::Tensor ids = torch::tensor({{1, 2, 3}}, torch::kInt64);
  auto ok = sessions.Run(Request(0, {1}, {0}, ids), *stage, model::Precision::kFp32, torch::kCPU);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->outputs.sizes(), (std::vector<int64_t>{1, 30}));
  EXPECT_THAT(ErrorOf(sessions, Request(0, {1}, {4}, ids), *stage),
              HasSubstr("starts: row 1 starts at position 4, but stage 0 holds only its first 3"));
  EXPECT_THAT(ErrorOf(sessions, Request(0, {0}, {0}, ids), *stage), "ran");
  EXPECT_THAT(ErrorOf(sessions, Request(0, {1, 1}, {0, 0}, torch::zeros({2, 1}, torch::kInt64)),
                      *stage),
              HasSubstr("rows: row 1 is repeated or outside the session's 2 rows"));
  EXPECT_THAT(ErrorOf(sessions, Request(0, {2}, {0}, ids), *stage),
              HasSubstr("rows: row 2 is repeated or outside"));
  EXPECT_THAT(ErrorOf(sessions, Request(0, {0}, {22}, ids), *stage),
              HasSubstr("starts: row 0 would run positions [22, 25), outside the session's 24"));
  EXPECT_THAT(ErrorOf(sessions, Request(0, {0}, {0}, torch::zeros({1, 3, 16})), *stage),
              HasSubstr("inputs: stage 0 takes int64 token ids [rows, T], got Float [1, 3, 16]"));
  EXPECT_THAT(ErrorOf(sessions, Request(0, {0}, {0}, torch::tensor({{1, 99}}, torch::kInt64)),
                      *stage),
              HasSubstr("inputs: stage 0 cannot take [1, 2]"));
  runtime::DecodeStepRequest other = Request(0, {0}, {0}, ids);
  other.session_rows = 3;
  EXPECT_THAT(ErrorOf(sessions, other, *stage),
              HasSubstr("session s1 has 2 rows of 24 positions, not 3 of 24"));
  auto mlp = model::BuildMlpStage(
      Parse("family: mlp, sizes: [4, 8, 2]"), 0, 1);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_THAT(ErrorOf(sessions, Request(0, {0}, {0}, ids), **mlp),
              HasSubstr("stage 0 is not a built-in decoder's (gpt or llama)"));
}

TEST(DecodeSessions, CachesAreFreedAtEndClearAndIdleTimeoutAndBoundedByMaxPositions) {
  const spec::BuiltinModel m = Gpt();
  auto stage = Build(m, 0, LayerCount(m));
  runtime::DecodeSessions sessions(absl::Milliseconds(50));
  runtime::DecodeStepRequest r = Request(0, {0}, {0}, torch::ones({1, 20}, torch::kInt64));
  auto out = sessions.Run(r, *stage, model::Precision::kFp32, torch::kCPU);
  ASSERT_TRUE(out.ok()) << out.status();
  // 2 layers x (keys + values) x [2 rows, 4 heads, 24 positions (20 doubled, capped), 4].
  EXPECT_EQ(out->cache_bytes, 2 * 2 * (2 * 4 * 24 * 4) * 4);
  EXPECT_EQ(sessions.cache_bytes(), out->cache_bytes);
  sessions.End("s1");
  EXPECT_EQ(sessions.sessions(), 0);
  EXPECT_EQ(sessions.cache_bytes(), 0);

  ASSERT_TRUE(sessions.Run(r, *stage, model::Precision::kFp32, torch::kCPU).ok());
  absl::SleepFor(absl::Milliseconds(120));
  r.session = "s2";
  ASSERT_TRUE(sessions.Run(r, *stage, model::Precision::kFp32, torch::kCPU).ok());
  EXPECT_EQ(sessions.sessions(), 1);  // s1 idled out
  sessions.Clear();
  EXPECT_EQ(sessions.sessions(), 0);
}

}  // namespace
}  // namespace stagecoach::kv_cache_test
