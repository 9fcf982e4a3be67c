// The training recipe's spec keys (training.lr_schedule, grad_clip, max_skipped_steps,
// activation_checkpointing, precision, model.builtin.tie_embeddings, eval): defaults, given
// values, and each wrong type and range refused naming the field.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/spec_test_util.h"

namespace stagecoach::spec::spec_recipe_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

TEST(SpecRecipeTest, TrainingRecipeDefaults) {
  const JobSpec spec = Parsed(kBase);
  EXPECT_EQ(spec.training.lr_schedule.kind, "constant");
  EXPECT_EQ(spec.training.lr_schedule.warmup_steps, 0);
  EXPECT_EQ(spec.training.lr_schedule.min_lr, 0.0);
  EXPECT_FALSE(spec.training.grad_clip_max_norm.has_value());
  EXPECT_EQ(spec.training.max_skipped_steps, 10);
  EXPECT_FALSE(spec.eval.has_value());
}

TEST(SpecRecipeTest, TrainingRecipeGiven) {
  const JobSpec spec = Parsed(absl::StrCat(
      Edit(kBase, "  batch_size: 8\n",
           "  batch_size: 8\n  lr_schedule: {kind: cosine, warmup_steps: 100, min_lr: 1.0e-3}\n"
           "  grad_clip: {max_norm: 1.0}\n  max_skipped_steps: 3\n"),
      "eval: {every_steps: 50, batches: 4, data: {kind: tensors, path: /d/val.pt}}\n"));
  EXPECT_EQ(spec.training.lr_schedule.kind, "cosine");
  EXPECT_EQ(spec.training.lr_schedule.warmup_steps, 100);
  EXPECT_DOUBLE_EQ(spec.training.lr_schedule.min_lr, 1e-3);
  EXPECT_THAT(spec.training.grad_clip_max_norm, Optional(1.0));
  EXPECT_EQ(spec.training.max_skipped_steps, 3);
  ASSERT_TRUE(spec.eval.has_value());
  EXPECT_EQ(spec.eval->every_steps, 50);
  EXPECT_EQ(spec.eval->batches, 4);
  EXPECT_EQ(spec.eval->data.kind, "tensors");
  EXPECT_EQ(spec.eval->data.path, "/d/val.pt");
}

TEST(SpecRecipeTest, TrainingRecipeErrorsNameTheField) {
  auto training = [](absl::string_view extra) {
    return Edit(kBase, "  batch_size: 8\n", absl::StrCat("  batch_size: 8\n", extra));
  };
  EXPECT_THAT(Errors(training("  lr_schedule: {kind: step}\n")),
              ElementsAre("training.lr_schedule.kind: must be one of constant, linear, cosine, "
                          "got 'step'"));
  EXPECT_THAT(Errors(training("  lr_schedule: {kind: cosine, warmup_steps: -1}\n")),
              ElementsAre(HasSubstr("training.lr_schedule.warmup_steps: must be >= 0")));
  EXPECT_THAT(Errors(training("  lr_schedule: {kind: linear, warmup_steps: 2.5}\n")),
              ElementsAre(HasSubstr("training.lr_schedule.warmup_steps")));
  EXPECT_THAT(Errors(training("  lr_schedule: {kind: cosine, min_lr: 0.5}\n")),
              ElementsAre("training.lr_schedule.min_lr: must be <= training.optimizer.lr (0.1), "
                          "got 0.5"));
  EXPECT_THAT(Errors(training("  lr_schedule: {kind: cosine, min_lr: -0.5}\n")),
              ElementsAre("training.lr_schedule.min_lr: must be >= 0, got -0.5"));
  EXPECT_THAT(Errors(training("  lr_schedule: {min_lr: 0.01}\n")),
              ElementsAre("training.lr_schedule.min_lr: only used by lr_schedule kind linear or "
                          "cosine"));
  EXPECT_THAT(Errors(training("  lr_schedule: cosine\n")),
              ElementsAre(HasSubstr("training.lr_schedule: ")));
  EXPECT_THAT(Errors(training("  grad_clip: {max_norm: 0}\n")),
              ElementsAre("training.grad_clip.max_norm: must be > 0, got 0"));
  EXPECT_THAT(Errors(training("  grad_clip: {max_norm: big}\n")),
              ElementsAre(HasSubstr("training.grad_clip.max_norm")));
  EXPECT_THAT(Errors(training("  grad_clip: {}\n")),
              ElementsAre("training.grad_clip.max_norm: required with training.grad_clip"));
  EXPECT_THAT(Errors(training("  grad_clip: {max_nrom: 1}\n")),
              ElementsAre(HasSubstr("training.grad_clip.max_nrom: unknown key"),
                          "training.grad_clip.max_norm: required with training.grad_clip"));
  EXPECT_THAT(Errors(training("  max_skipped_steps: 0\n")),
              ElementsAre(HasSubstr("training.max_skipped_steps: must be >= 1")));
  EXPECT_THAT(Errors(training("  max_skipped_steps: many\n")),
              ElementsAre(HasSubstr("training.max_skipped_steps")));
}

TEST(SpecRecipeTest, DocumentRowsAndTheLossNormalisedByTokens) {
  // A GPT with cross_entropy, `training` added to its training keys.
  auto gpt = [](absl::string_view training = "") {
    return Edit(Edit(kBase, "  builtin: {family: mlp, sizes: [8, 16, 16, 16, 4]}\n",
                     "  builtin: {family: gpt, vocab: 32, d_model: 16, layers: 2, heads: 2, "
                     "seq: 8}\n"),
                "  batch_size: 8\n",
                absl::StrCat("  batch_size: 8\n  loss: cross_entropy\n", training));
  };
  auto with_data = [&](absl::string_view data, absl::string_view training = "") {
    return Edit(gpt(training), "data:\n  kind: synthetic\n", data);
  };
  // Defaults: windows, and tokens data normalises the loss by tokens.
  JobSpec spec = Parsed(with_data("data: {kind: tokens, path: /d/t.bin}\n"));
  EXPECT_EQ(spec.data.packing, "");
  EXPECT_FALSE(spec.data.eos.has_value());
  EXPECT_EQ(LossNormalizationOf(spec), "tokens");
  EXPECT_EQ(LossNormalizationOf(Parsed(gpt())), "microbatches");  // synthetic data
  // An EOS makes documents, packed unless pad is asked for.
  spec = Parsed(with_data("data: {kind: tokens, path: /d/t.bin, eos: 2}\n"));
  EXPECT_EQ(spec.data.packing, "pack");
  EXPECT_THAT(spec.data.eos, Optional(2));
  spec = Parsed(with_data("data: {kind: tokens, path: /d/t.bin, packing: pad}\n",
                          "  loss_normalization: microbatches\n"));
  EXPECT_EQ(spec.data.packing, "pad");
  EXPECT_EQ(LossNormalizationOf(spec), "microbatches");
  // Errors name the field.
  EXPECT_THAT(Errors(with_data("data: {kind: tokens, path: /d/t.bin, packing: greedy}\n")),
              ElementsAre("data.packing: must be one of pad, pack, got 'greedy'"));
  EXPECT_THAT(Errors(with_data("data: {kind: tokens, path: /d/t.bin, eos: -1}\n")),
              ElementsAre(HasSubstr("data.eos: must be >= 0")));
  EXPECT_THAT(Errors(with_data("data: {kind: synthetic, packing: pad, eos: 1}\n")),
              ElementsAre("data.packing: only used by data.kind tokens or jsonl",
                          "data.eos: only used by data.kind tokens"));
  EXPECT_THAT(
      Errors(with_data("data: {kind: tokens, path: /d/t.bin}\n", "  loss_normalization: words\n")),
      ElementsAre("training.loss_normalization: must be one of tokens, microbatches, got "
                  "'words'"));
  // Fine-tuning records: a tokenizer, the fields, what an overlong record becomes; packed by
  // default, normalised by tokens.
  spec = Parsed(
      with_data("data: {kind: jsonl, path: /d/t.jsonl, tokenizer: /d/m.model, fields: {prompt: q, "
                "response: a}, overlong: skip}\n"));
  EXPECT_EQ(spec.data.tokenizer, "/d/m.model");
  EXPECT_EQ(spec.data.prompt_field, "q");
  EXPECT_EQ(spec.data.response_field, "a");
  EXPECT_EQ(spec.data.overlong, "skip");
  EXPECT_EQ(spec.data.packing, "pack");
  EXPECT_EQ(LossNormalizationOf(spec), "tokens");
  EXPECT_THAT(Errors(with_data("data: {kind: jsonl, path: /d/t.jsonl}\n")),
              ElementsAre("data.tokenizer: required for data.kind jsonl (the records' "
                          "SentencePiece model)"));
  EXPECT_THAT(Errors(with_data("data: {kind: tokens, path: /d/t.bin, tokenizer: /m, overlong: "
                               "skip}\n")),
              ElementsAre("data.tokenizer: only used by data.kind jsonl",
                          "data.overlong: only used by data.kind jsonl"));
  EXPECT_THAT(Errors(with_data("data: {kind: jsonl, path: /d/t.jsonl, tokenizer: /m, overlong: "
                               "cut, fields: {prompt: ''}}\n")),
              ElementsAre(HasSubstr("data.overlong: must be one of truncate, skip, fail"),
                          "data.fields.prompt: must be a non-empty key"));
  EXPECT_THAT(
      Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  loss_normalization: tokens\n")),
      ElementsAre("training.loss_normalization: tokens needs training.loss cross_entropy (a loss "
                  "per token), got mse"));
}

TEST(SpecRecipeTest, RecomputationAndTiedEmbeddings) {
  EXPECT_EQ(Parsed(kBase).training.activation_checkpointing, "none");
  EXPECT_EQ(Parsed(Edit(kBase, "  batch_size: 8\n",
                        "  batch_size: 8\n  activation_checkpointing: full\n"))
                .training.activation_checkpointing,
            "full");
  EXPECT_EQ(Parsed(kBase).training.precision, "fp32");
  EXPECT_EQ(Parsed(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  precision: bf16\n"))
                .training.precision,
            "bf16");
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  precision: fp16\n")),
              ElementsAre("training.precision: must be one of fp32, bf16, got 'fp16'"));
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n",
                          "  batch_size: 8\n  activation_checkpointing: selective\n")),
              ElementsAre("training.activation_checkpointing: must be one of none, full, got "
                          "'selective'"));
  const std::string gpt = Edit(kBase, "builtin: {family: mlp, sizes: [8, 16, 16, 16, 4]}",
                               "builtin: {family: gpt, vocab: 32, d_model: 16, layers: 2, "
                               "heads: 2, seq: 8, tie_embeddings: true}");
  EXPECT_TRUE(Parsed(gpt).model.builtin->tie_embeddings);
  EXPECT_FALSE(Parsed(Edit(gpt, ", tie_embeddings: true", "")).model.builtin->tie_embeddings);
  EXPECT_THAT(Errors(Edit(gpt, "tie_embeddings: true", "tie_embeddings: 1")),
              ElementsAre(HasSubstr("model.builtin.tie_embeddings")));
  EXPECT_THAT(Errors(Edit(kBase, "sizes: [8, 16, 16, 16, 4]",
                          "sizes: [8, 16, 16, 16, 4], tie_embeddings: true")),
              ElementsAre("model.builtin.tie_embeddings: not a key of family mlp"));
  EXPECT_THAT(Errors(Edit(gpt, "  workers: 2\n", "  workers: 2\n  shard_optimizer: true\n")),
              ElementsAre(HasSubstr("model.builtin.tie_embeddings: not supported with "
                                    "placement.shard: optimizer")));
}

TEST(SpecRecipeTest, EvalErrorsNameTheField) {
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: {batches: 2, data: {seed: 3}}\n")),
              ElementsAre("eval.every_steps: required with eval"));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: {every_steps: 0, data: {seed: 3}}\n")),
              ElementsAre(HasSubstr("eval.every_steps: must be >= 1")));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: {every_steps: 5, batches: 0, data: {}}\n")),
              ElementsAre(HasSubstr("eval.batches: must be >= 1")));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: {every_steps: 5, batches: 100001, data: {}}\n")),
              ElementsAre(HasSubstr("eval.batches")));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: {every_steps: 5}\n")),
              ElementsAre("eval.data: required with eval (the held-out data)"));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: {every_steps: 5, data: {kind: tokens}}\n")),
              ElementsAre("eval.data.path: required for eval.data.kind tokens"));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: {every_steps: 5, data: {path: x}}\n")),
              ElementsAre("eval.data.path: not used by eval.data.kind synthetic (use kind tokens "
                          "or tensors)"));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: {every_step: 5, data: {}}\n")),
              ElementsAre(HasSubstr("eval.every_step: unknown key (valid keys: every_steps, "
                                    "batches, data); did you mean 'every_steps'?"),
                          "eval.every_steps: required with eval"));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "eval: 5\n")), ElementsAre(HasSubstr("eval: ")));
}

}  // namespace
}  // namespace stagecoach::spec::spec_recipe_test
