// The built-in GPT family (worker/model/gpt.h) and the tokens dataset
// (worker/runtime/data/training_data.h): stages chained equal the whole model exactly,
// per-layer parameter counts equal the planner's, and a tokens file gives shifted windows per
// (seed, step).
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "coordinator/planning/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "worker/model/gpt.h"
#include "worker/runtime/executor/training_setup.h"
#include "worker/runtime/data/training_data.h"

namespace stagecoach::gpt_model_test {
namespace {

using ::testing::HasSubstr;

spec::BuiltinModel Gpt() {
  spec::BuiltinModel m;
  m.family = "gpt";
  m.vocab = 50;
  m.d_model = 16;
  m.layers = 3;
  m.heads = 4;
  m.seq = 8;
  m.seed = 7;
  return m;
}

std::unique_ptr<model::StageModel> Build(const spec::BuiltinModel& m, int first, int end) {
  auto stage = model::BuildGptStage(m, first, end);
  EXPECT_TRUE(stage.ok()) << stage.status();
  return *std::move(stage);
}

torch::Tensor Tokens(const spec::BuiltinModel& m, int64_t b, int64_t t) {
  return torch::randint(0, m.vocab, {b, t}, torch::kInt64);
}

TEST(GptStage, StagesInSequenceEqualTheWholeModel) {
  const spec::BuiltinModel m = Gpt();  // layers: embed, blocks.0-2, norm, head
  auto whole = Build(m, 0, 6);
  auto a = Build(m, 0, 2);
  auto b = Build(m, 2, 4);
  auto c = Build(m, 4, 6);
  torch::manual_seed(1);
  const torch::Tensor x = Tokens(m, 3, m.seq);
  const torch::Tensor want = whole->Forward(x);
  EXPECT_EQ(want.sizes(), (std::vector<int64_t>{3, m.seq, m.vocab}));
  EXPECT_EQ(want.scalar_type(), torch::kFloat32);
  const torch::Tensor h = a->Forward(x);
  EXPECT_EQ(h.sizes(), (std::vector<int64_t>{3, m.seq, m.d_model}));
  EXPECT_EQ(h.scalar_type(), torch::kFloat32);
  const torch::Tensor got = c->Forward(b->Forward(h));
  EXPECT_TRUE(torch::equal(got, want));
  // A shorter sequence works too.
  EXPECT_EQ(whole->Forward(x.slice(1, 0, 5)).sizes(), (std::vector<int64_t>{3, 5, m.vocab}));

  // The same parameters, whatever the split.
  std::map<std::string, torch::Tensor> split;
  for (auto* s : {a.get(), b.get(), c.get()}) {
    for (auto& [name, p] : s->NamedParameters()) split[name] = p;
  }
  const auto all = whole->NamedParameters();
  ASSERT_EQ(all.size(), split.size());
  for (const auto& [name, p] : all) {
    ASSERT_EQ(split.count(name), 1u) << name;
    EXPECT_TRUE(torch::equal(p, split[name])) << name;
  }
}

TEST(GptStage, IsCausal) {
  const spec::BuiltinModel m = Gpt();
  auto whole = Build(m, 0, 6);
  torch::manual_seed(2);
  torch::Tensor x = Tokens(m, 2, m.seq);
  torch::Tensor y = whole->Forward(x);
  torch::Tensor x2 = x.clone();
  x2.index_put_({torch::indexing::Slice(), m.seq - 1}, (x.select(1, m.seq - 1) + 1) % m.vocab);
  torch::Tensor y2 = whole->Forward(x2);
  EXPECT_TRUE(torch::equal(y.slice(1, 0, m.seq - 1), y2.slice(1, 0, m.seq - 1)));
  EXPECT_FALSE(torch::equal(y.select(1, m.seq - 1), y2.select(1, m.seq - 1)));
}

TEST(GptStage, NamesAndInit) {
  const spec::BuiltinModel m = Gpt();
  auto whole = Build(m, 0, 6);
  std::map<std::string, torch::Tensor> params;
  for (auto& [name, p] : whole->NamedParameters()) params[name] = p;
  for (const char* name :
       {"embed.tok.weight", "embed.pos.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
        "blocks.2.attn.qkv.weight", "blocks.2.attn.qkv.bias", "blocks.1.attn.proj.weight",
        "blocks.1.ln2.bias", "blocks.1.mlp.fc.weight", "blocks.1.mlp.proj.bias", "norm.weight",
        "norm.bias", "head.weight"}) {
    EXPECT_EQ(params.count(name), 1u) << name;
  }
  EXPECT_EQ(params.count("head.bias"), 0u);
  EXPECT_TRUE(torch::equal(params["norm.weight"], torch::ones({m.d_model})));
  EXPECT_TRUE(torch::equal(params["blocks.0.attn.qkv.bias"], torch::zeros({3 * m.d_model})));
  const double std = params["blocks.0.mlp.fc.weight"].std().item<double>();
  EXPECT_NEAR(std, 0.02, 0.004);
  // Another seed, other parameters.
  spec::BuiltinModel other = m;
  other.seed = 8;
  auto o = Build(other, 0, 1);
  EXPECT_FALSE(torch::equal(o->NamedParameters()[0].second, params["embed.tok.weight"]));
}

TEST(GptStage, ParameterCountsEqualThePlanners) {
  const spec::BuiltinModel m = Gpt();
  const std::vector<int64_t> planned = coordinator::BuiltinLayerParameters(m);
  ASSERT_EQ(planned.size(), 6u);
  for (int layer = 0; layer < 6; ++layer) {
    auto stage = Build(m, layer, layer + 1);
    int64_t count = 0;
    for (auto& [name, p] : stage->NamedParameters()) count += p.numel();
    EXPECT_EQ(count, planned[layer]) << "layer " << layer;
  }
}

TEST(GptStage, RefusesBadSizesNamingTheField) {
  spec::BuiltinModel m = Gpt();
  m.heads = 3;
  EXPECT_THAT(std::string(model::BuildGptStage(m, 0, 1).status().message()),
              HasSubstr("model.builtin.d_model"));
  m = Gpt();
  m.vocab = 0;
  EXPECT_THAT(std::string(model::BuildGptStage(m, 0, 1).status().message()),
              HasSubstr("model.builtin.vocab"));
  m = Gpt();
  EXPECT_FALSE(model::BuildGptStage(m, 0, 7).ok());
  EXPECT_FALSE(model::BuildGptStage(m, 2, 2).ok());
}

TEST(ComputeLoss, CrossEntropyOverSequencesIsTheMeanOverPositions) {
  torch::manual_seed(3);
  torch::Tensor logits = torch::randn({2, 5, 7});
  torch::Tensor targets = torch::randint(0, 7, {2, 5}, torch::kInt64);
  torch::Tensor got = runtime::ComputeLoss(runtime::LossKind::kCrossEntropy, logits, targets);
  torch::Tensor want =
      torch::nn::functional::cross_entropy(logits.reshape({10, 7}), targets.reshape({10}));
  EXPECT_TRUE(torch::allclose(got, want));
}

class TokensTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = absl::StrCat(dir_, "/", name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // Token i is i mod 50, little-endian uint16.
  std::string Counting(int n) {
    std::string bytes;
    for (int i = 0; i < n; ++i) {
      const int v = i % 50;
      bytes.push_back(static_cast<char>(v & 0xff));
      bytes.push_back(static_cast<char>(v >> 8));
    }
    return bytes;
  }

  spec::JobSpec Spec(const std::string& path) {
    spec::JobSpec spec;
    spec.model.builtin = Gpt();
    spec.training.batch_size = 6;
    spec.training.loss = "cross_entropy";
    spec.data.kind = "tokens";
    spec.data.path = path;
    spec.data.seed = 99;
    return spec;
  }

  stagecoach::testing::TempDir tmp_{"gpt_tokens_test"};
  const std::string dir_ = tmp_.path();
};

TEST_F(TokensTest, WindowsWithShiftedTargetsPerSeedAndStep) {
  const spec::JobSpec spec = Spec(Write("train.bin", Counting(1000)));
  auto source = runtime::BatchSource::Open(spec, true, true);
  ASSERT_TRUE(source.ok()) << source.status();
  auto batch = (*source)->Make(0);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const torch::Tensor& x = batch->inputs;
  const torch::Tensor& y = batch->targets;
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{6, 8}));
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(x.scalar_type(), torch::kInt64);
  EXPECT_EQ(y.scalar_type(), torch::kInt64);
  // Each row counts up by one mod 50, and targets are inputs shifted by one.
  EXPECT_TRUE(torch::equal(x.slice(1, 1, 8), y.slice(1, 0, 7)));
  EXPECT_TRUE(torch::equal(y, (x + 1) % 50));
  // Starts come from generator(seed + 1 + step) over [0, N - seq - 1]: reproduce them.
  at::Generator gen = at::detail::createCPUGenerator(99 + 1 + 0);
  torch::Tensor starts = torch::randint(0, 1000 - 8, {6}, gen, torch::kInt64);
  EXPECT_TRUE(torch::equal(x.select(1, 0), starts % 50));

  // Deterministic per (seed, step): another source, the same batch; another step, another.
  auto again = runtime::BatchSource::Open(spec, true, false);
  ASSERT_TRUE(again.ok());
  auto same = (*again)->Make(0);
  EXPECT_TRUE(torch::equal(same->inputs, x));
  EXPECT_FALSE(same->targets.defined());
  auto targets_only = runtime::MakeBatch(spec, 0, false, true);
  ASSERT_TRUE(targets_only.ok());
  EXPECT_FALSE(targets_only->inputs.defined());
  EXPECT_TRUE(torch::equal(targets_only->targets, y));
  EXPECT_FALSE(torch::equal((*again)->Make(1)->inputs, x));
  spec::JobSpec other = spec;
  other.data.seed = 100;
  EXPECT_FALSE(torch::equal(runtime::MakeBatch(other, 0, true, false)->inputs, x));
}

// data.dtype uint32: four bytes per token, the same windows; ids past 65,535 for a vocabulary
// that large.
TEST_F(TokensTest, Uint32FilesGiveTheSameWindowsAndTakeLargeIds) {
  std::string wide;
  for (int i = 0; i < 1000; ++i) {
    const uint32_t v = static_cast<uint32_t>(i % 50);
    for (int b = 0; b < 4; ++b) wide.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
  }
  spec::JobSpec narrow = Spec(Write("narrow.bin", Counting(1000)));
  spec::JobSpec spec = Spec(Write("wide.bin", wide));
  spec.data.dtype = "uint32";
  auto got = runtime::MakeBatch(spec, 2, true, true);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(torch::equal(got->inputs, runtime::MakeBatch(narrow, 2, true, true)->inputs));
  std::string big(4 * 20, '\0');
  big[2] = 1;  // token 0 is 65536
  spec = Spec(Write("big.bin", big));
  spec.data.dtype = "uint32";
  spec.model.builtin->vocab = 70000;
  EXPECT_TRUE(runtime::MakeBatch(spec, 0, true, true).ok());
  spec.model.builtin->vocab = 65536;
  auto refused = runtime::MakeBatch(spec, 0, true, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("token 0 is 65536"));
}

// A TorchScript model reads the same file with data.seq tokens per row and no vocabulary.
TEST_F(TokensTest, ATorchScriptModelTakesDataSeqTokensPerRow) {
  spec::JobSpec spec = Spec(Write("ts.bin", Counting(1000)));
  spec.model.builtin.reset();
  spec.model.torchscript = "model.pt";
  spec.data.seq = 5;
  auto batch = runtime::MakeBatch(spec, 3, true, true);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->inputs.sizes(), (std::vector<int64_t>{6, 5}));
  EXPECT_TRUE(torch::equal(batch->targets, (batch->inputs + 1) % 50));
  spec.data.seq = 0;
  auto missing = runtime::BatchSource::Open(spec, true, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("data.seq: required"));
}

// data.kind synthetic for a gpt: arithmetic sequences mod vocab, per seed and step.
TEST_F(TokensTest, SyntheticTokensAreLearnableSequencesPerSeedAndStep) {
  spec::JobSpec spec = Spec("");
  spec.data.kind = "synthetic";
  spec.data.path.clear();
  auto batch = runtime::MakeBatch(spec, 0, true, true);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const torch::Tensor& x = batch->inputs;
  const torch::Tensor& y = batch->targets;
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{6, 8}));
  EXPECT_TRUE(torch::equal(x.slice(1, 1, 8), y.slice(1, 0, 7)));
  // Every row steps by one stride mod 50, the same all along.
  const torch::Tensor stride = (x.select(1, 1) - x.select(1, 0)).remainder(50);
  EXPECT_TRUE(torch::equal((x.select(1, 0) + 7 * stride).remainder(50), x.select(1, 7)));
  EXPECT_TRUE(torch::all(stride > 0).item<bool>());
  EXPECT_TRUE(torch::all(x < 50).item<bool>());
  EXPECT_TRUE(torch::equal(runtime::MakeBatch(spec, 0, true, false)->inputs, x));
  EXPECT_FALSE(torch::equal(runtime::MakeBatch(spec, 1, true, false)->inputs, x));
}

TEST_F(TokensTest, ErrorsNameTheFieldAndThePlace) {
  auto message = [&](const spec::JobSpec& spec) {
    auto source = runtime::BatchSource::Open(spec, true, true);
    EXPECT_FALSE(source.ok());
    return std::string(source.status().message());
  };
  const std::string missing = absl::StrCat(dir_, "/missing.bin");
  EXPECT_THAT(message(Spec(missing)), HasSubstr(absl::StrCat("data.path: cannot open '", missing)));
  EXPECT_THAT(message(Spec(Write("odd.bin", Counting(20) + "x"))),
              HasSubstr("has 41 bytes, not a whole number of uint16 tokens"));
  EXPECT_THAT(message(Spec(Write("short.bin", Counting(8)))),
              HasSubstr("holds 8 tokens, fewer than model.builtin.seq + 1 = 9"));
  std::string big = Counting(30);
  big[2 * 17] = static_cast<char>(0x34);
  big[2 * 17 + 1] = static_cast<char>(0x12);
  EXPECT_THAT(message(Spec(Write("big.bin", big))),
              HasSubstr("token 17 is 4660, not below model.builtin.vocab = 50"));
  spec::JobSpec mlp = Spec(Write("ok.bin", Counting(30)));
  mlp.model.builtin->family = "mlp";
  EXPECT_THAT(message(mlp),
              HasSubstr("data.kind: tokens data needs a built-in gpt or llama or a TorchScript model"));
  // A rank that needs neither inputs nor targets does not read the file.
  EXPECT_TRUE(runtime::BatchSource::Open(Spec(missing), false, false).ok());
}

}  // namespace
}  // namespace stagecoach::gpt_model_test
