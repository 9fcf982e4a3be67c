// Rows packed with several documents (data.packing: pack) in the built-in decoders: with the
// row's segments set (StageModel::SetSegments), every document of a packed row gives the logits
// it gives run alone (its positions from 0, attending within itself only), for the GPT (learned
// positions) and the Llama family (rotary positions, grouped-query attention); a model cut in two
// stages does the same; without segments a row is one sequence again; and a stage that cannot
// keep documents apart says so.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "common/spec/spec_parser.h"
#include "gtest/gtest.h"
#include "worker/model/gpt.h"
#include "worker/model/kv_cache.h"
#include "worker/model/llama.h"
#include "worker/model/mlp.h"

namespace stagecoach::packed_rows_test {
namespace {

spec::BuiltinModel Gpt() {
  spec::BuiltinModel m;
  m.family = "gpt";
  m.vocab = 24;
  m.d_model = 16;
  m.layers = 2;
  m.heads = 2;
  m.seq = 12;
  m.seed = 3;
  return m;
}

spec::BuiltinModel Llama() {
  absl::StatusOr<spec::JobSpec> spec = spec::ParseJobSpec(
      "name: t\nmodel:\n  builtin: {family: llama, vocab_size: 24, hidden_size: 16, "
      "intermediate_size: 24, num_hidden_layers: 2, num_attention_heads: 4, "
      "num_key_value_heads: 2, seq: 12, seed: 5}\nschedule: {kind: 1F1B}\ntraining: "
      "{batch_size: 2, loss: cross_entropy}\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec->model.builtin : spec::BuiltinModel{};
}

using Builder = absl::StatusOr<std::unique_ptr<model::StageModel>> (*)(const spec::BuiltinModel&,
                                                                       int, int);

// Row 0: documents of 4, 3 and 2 tokens, then 3 padding positions; row 1: one document of 12.
struct PackedRows {
  torch::Tensor tokens, segments;
  std::vector<std::vector<int64_t>> row0_documents;  // [begin, end) pairs of row 0
};

PackedRows Rows() {
  torch::manual_seed(8);
  PackedRows p;
  p.tokens = torch::randint(0, 24, {2, 12}, torch::kInt64);
  p.segments = torch::tensor({0, 0, 0, 0, 1, 1, 1, 2, 2, -1, -1, -1}, torch::kInt64)
                   .unsqueeze(0)
                   .repeat({2, 1});
  p.segments[1].fill_(0);
  p.row0_documents = {{0, 4}, {4, 7}, {7, 9}};
  return p;
}

void ExpectDocumentsAsAlone(model::StageModel& whole, const std::vector<model::StageModel*>& chain,
                            const char* family) {
  const PackedRows p = Rows();
  torch::NoGradGuard no_grad;
  torch::Tensor packed = p.tokens;
  for (model::StageModel* stage : chain) {
    ASSERT_TRUE(stage->SetSegments(p.segments));
    packed = stage->Forward(packed);
    stage->SetSegments(torch::Tensor());
  }
  for (const auto& d : p.row0_documents) {
    const torch::Tensor alone = whole.Forward(p.tokens.slice(0, 0, 1).slice(1, d[0], d[1]));
    EXPECT_TRUE(torch::allclose(packed.slice(0, 0, 1).slice(1, d[0], d[1]), alone, 1e-5, 1e-6))
        << family << ": document [" << d[0] << ", " << d[1] << ")";
  }
  // A row of one document is the row run as one sequence.
  EXPECT_TRUE(torch::allclose(packed[1], whole.Forward(p.tokens.slice(0, 1, 2))[0], 1e-5, 1e-6))
      << family;
  // Without segments the documents see each other again: the second one's logits change.
  const torch::Tensor unpacked = whole.Forward(p.tokens);
  EXPECT_FALSE(torch::allclose(unpacked.slice(0, 0, 1).slice(1, 4, 7),
                               packed.slice(0, 0, 1).slice(1, 4, 7), 1e-4, 1e-5))
      << family << ": segments changed nothing";
}

void CheckFamily(const spec::BuiltinModel& m, Builder build, int layers, const char* family) {
  auto whole = build(m, 0, layers);
  auto first = build(m, 0, 2);
  auto second = build(m, 2, layers);
  ASSERT_TRUE(whole.ok() && first.ok() && second.ok());
  ExpectDocumentsAsAlone(**whole, {whole->get()}, family);
  ExpectDocumentsAsAlone(**whole, {first->get(), second->get()}, family);
}

TEST(PackedRows, EachDocumentOfAGptRowGivesItsLogitsAlone) {
  CheckFamily(Gpt(), &model::BuildGptStage, 2 + 3, "gpt");
}

TEST(PackedRows, EachDocumentOfALlamaRowGivesItsLogitsAlone) {
  CheckFamily(Llama(), &model::BuildLlamaStage, 2 + 3, "llama");
}

TEST(PackedRows, PositionsRestartAtEachDocumentAndOthersAreHidden) {
  const model::DecodePositions at =
      model::DecodePositions::Packed(torch::tensor({{0, 0, 1, 1, 1, -1}}, torch::kInt64));
  EXPECT_TRUE(torch::equal(at.positions, torch::tensor({{0, 1, 0, 1, 2, 0}}, torch::kInt64)));
  // Position 3 (document 1's second) sees positions 2 and 3 only.
  EXPECT_TRUE(torch::equal(at.hidden[0][0][3],
                           torch::tensor({true, true, false, false, true, true})));
}

TEST(PackedRows, AStageThatCannotKeepDocumentsApartSaysSo) {
  spec::BuiltinModel mlp;
  mlp.family = "mlp";
  mlp.sizes = {4, 4};
  auto stage = model::BuildMlpStage(mlp, 0, 1);
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_FALSE((*stage)->SetSegments(torch::zeros({1, 4}, torch::kInt64)));
  EXPECT_TRUE((*stage)->SetSegments(torch::Tensor()));
}

}  // namespace
}  // namespace stagecoach::packed_rows_test
