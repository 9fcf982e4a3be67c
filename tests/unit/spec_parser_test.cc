// The YAML job spec contract (DESIGN.md "Spec"): parsing, defaults and every validation rule
// with its exact message.
#include "common/spec/spec_parser.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"
#include "tests/support/test_paths.h"
#include "tests/unit/spec_test_util.h"

namespace stagecoach::spec::spec_parser_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Optional;
using ::testing::Pair;

// The DESIGN.md example, as written.
constexpr char kDesignExample[] = R"(name: gpt-tiny
model:
  torchscript: gpt.pt            # or builtin: {family: gpt, vocab: 512, d_model: 128, layers: 8, heads: 4, seq: 64}
split:
  stages: 8                      # or points: {"layers.4": beginning}
  policy: equal-params           # equal-params | equal-layers | profiled
schedule:
  kind: ZBVZeroBubble            # any generator name, or csv: my_schedule.csv
  microbatches: 16
placement:
  workers: 4
  device: cuda                   # cuda | cpu
training:
  batch_size: 64
  steps: 1000
  loss: cross_entropy            # cross_entropy | mse
  optimizer: {kind: adamw, lr: 3.0e-4, weight_decay: 0.01}
  checkpoint: {dir: /ckpt, every_steps: 100}
data:
  kind: tokens                   # tokens (flat uint16 token file) | tensors | synthetic
  path: train.bin
  seed: 1234
)";

// ---------------------------------------------------------------------------------------------
// Whole specs.

TEST(SpecParserTest, EveryExampleConfigParses) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::ConfigsDir())) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<JobSpec> spec =
        ParseJobSpec(testing::ReadFile(entry.path().string()), entry.path().filename().string());
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    EXPECT_FALSE(spec->name.empty());
    EXPECT_TRUE(spec->model.torchscript.has_value() != spec->model.builtin.has_value());
  }
  EXPECT_GT(count, 0) << "no *.yaml in " << testing::ConfigsDir();
}

TEST(SpecParserTest, ExampleConfigValues) {
  JobSpec spec = Parsed(testing::ReadFile(testing::ConfigsDir() + "/mlp-4stage-gpipe.yaml"));
  EXPECT_EQ(spec.name, "mlp-4stage-gpipe");
  ASSERT_TRUE(spec.model.builtin.has_value());
  EXPECT_EQ(spec.model.builtin->family, "mlp");
  EXPECT_THAT(spec.model.builtin->sizes, ElementsAre(32, 128, 128, 128, 10));
  EXPECT_EQ(spec.model.builtin->seed, 7u);
  EXPECT_EQ(spec.split.stages, 4);
  EXPECT_EQ(spec.schedule.kind, "GPipe");
  EXPECT_EQ(spec.training.optimizer.kind, "sgd");
  EXPECT_EQ(spec.training.steps, 200);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.lr, 0.1);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.momentum, 0.9);
  EXPECT_EQ(spec.data.seed, 1234u);
}

TEST(SpecParserTest, DesignExampleAsWritten) {
  JobSpec spec = Parsed(kDesignExample);
  EXPECT_EQ(spec.name, "gpt-tiny");
  EXPECT_THAT(spec.model.torchscript, Optional(std::string("gpt.pt")));
  EXPECT_FALSE(spec.model.builtin.has_value());
  EXPECT_EQ(spec.split.stages, 8);
  EXPECT_THAT(spec.split.points, IsEmpty());
  EXPECT_EQ(spec.split.policy, "equal-params");
  EXPECT_EQ(spec.schedule.kind, "ZBVZeroBubble");
  EXPECT_EQ(spec.schedule.microbatches, 16);
  EXPECT_EQ(spec.schedule.csv, "");
  EXPECT_EQ(spec.placement.workers, 4);
  EXPECT_EQ(spec.placement.device, "cuda");
  EXPECT_EQ(spec.placement.style, "");
  EXPECT_EQ(spec.training.batch_size, 64);
  EXPECT_EQ(spec.training.steps, 1000);
  EXPECT_EQ(spec.training.loss, "cross_entropy");
  EXPECT_TRUE(spec.training.scale_grads);
  EXPECT_EQ(spec.training.optimizer.kind, "adamw");
  EXPECT_DOUBLE_EQ(spec.training.optimizer.lr, 3.0e-4);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.eps, 1e-8);
  EXPECT_EQ(spec.training.checkpoint.dir, "/ckpt");
  EXPECT_EQ(spec.training.checkpoint.every_steps, 100);
  EXPECT_EQ(spec.data.kind, "tokens");
  EXPECT_EQ(spec.data.path, "train.bin");
  EXPECT_EQ(spec.data.seed, 1234u);
  EXPECT_EQ(spec.restart.max_restarts, 0);
}

TEST(SpecParserTest, DesignExampleWithBuiltinGpt) {
  JobSpec spec = Parsed(Edit(kDesignExample, "  torchscript: gpt.pt ",
                             "  builtin: {family: gpt, vocab: 512, d_model: 128, layers: 8, "
                             "heads: 4, seq: 64}"));
  EXPECT_FALSE(spec.model.torchscript.has_value());
  ASSERT_TRUE(spec.model.builtin.has_value());
  const BuiltinModel& gpt = *spec.model.builtin;
  EXPECT_EQ(gpt.family, "gpt");
  EXPECT_EQ(gpt.vocab, 512);
  EXPECT_EQ(gpt.d_model, 128);
  EXPECT_EQ(gpt.layers, 8);
  EXPECT_EQ(gpt.heads, 4);
  EXPECT_EQ(gpt.seq, 64);
  EXPECT_EQ(gpt.seed, 0u);
  EXPECT_THAT(gpt.sizes, IsEmpty());
  EXPECT_EQ(BuiltinLayerCount(gpt), 11);
}

TEST(SpecParserTest, DesignExampleWithSplitPoints) {
  // The example's alternative split, for a builtin GPT (whose blocks are blocks.N, not layers.N).
  std::string yaml = Edit(kDesignExample, "  torchscript: gpt.pt ",
                          "  builtin: {family: gpt, vocab: 512, d_model: 128, layers: 8, "
                          "heads: 4, seq: 64} ");
  yaml = Edit(yaml, "  stages: 8 ", "  points: {\"blocks.4\": beginning, norm: end} ");
  JobSpec spec = Parsed(yaml);
  EXPECT_EQ(spec.split.stages, 0);
  EXPECT_THAT(spec.split.points, ElementsAre(Pair("blocks.4", "beginning"), Pair("norm", "end")));

  // As written (layers.4) it is fine for a TorchScript model, whose layers only a worker knows.
  JobSpec torchscript =
      Parsed(Edit(kDesignExample, "  stages: 8 ", "  points: {\"layers.4\": beginning} "));
  EXPECT_THAT(torchscript.split.points, ElementsAre(Pair("layers.4", "beginning")));
}

TEST(SpecParserTest, DefaultsFilledIn) {
  JobSpec spec = Parsed(R"(
name: minimal
model: {torchscript: m.pt}
schedule: {kind: GPipe}
training: {batch_size: 4}
)");
  EXPECT_EQ(spec.name, "minimal");
  EXPECT_EQ(spec.split.stages, 0);
  EXPECT_THAT(spec.split.points, IsEmpty());
  EXPECT_EQ(spec.split.policy, "equal-layers");
  EXPECT_EQ(spec.schedule.microbatches, 1);
  EXPECT_EQ(spec.schedule.csv_format, "compute_only");
  EXPECT_EQ(spec.schedule.csv_text, "");
  EXPECT_EQ(spec.placement.workers, 0);
  EXPECT_EQ(spec.placement.device, "cpu");
  EXPECT_EQ(spec.placement.style, "");
  EXPECT_EQ(spec.training.batch_size, 4);
  EXPECT_EQ(spec.training.steps, 1);
  EXPECT_EQ(spec.training.loss, "mse");
  EXPECT_TRUE(spec.training.scale_grads);
  EXPECT_EQ(spec.training.optimizer.kind, "sgd");
  EXPECT_DOUBLE_EQ(spec.training.optimizer.lr, 0.01);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.momentum, 0.0);
  EXPECT_EQ(spec.training.checkpoint.dir, "");
  EXPECT_EQ(spec.training.checkpoint.every_steps, 0);
  EXPECT_EQ(spec.data.kind, "synthetic");
  EXPECT_EQ(spec.data.path, "");
  EXPECT_EQ(spec.data.seed, 0u);
  EXPECT_EQ(spec.restart.max_restarts, 0);
}

TEST(SpecParserTest, DataParallelPlacement) {
  const JobSpec plain = Parsed(kBase);
  EXPECT_EQ(plain.placement.replicas, 1);
  EXPECT_EQ(plain.placement.shard, ShardLevel::kNone);
  EXPECT_FALSE(plain.placement.shards());
  EXPECT_TRUE(plain.placement.overlap_reduction);
  const JobSpec dp = Parsed(Edit(kBase, "  workers: 2\n",
                                 "  workers: 2\n  replicas: 2\n  shard_optimizer: true\n"
                                 "  overlap_reduction: false\n"));
  EXPECT_EQ(dp.placement.replicas, 2);
  EXPECT_EQ(dp.placement.shard, ShardLevel::kOptimizer);
  EXPECT_FALSE(dp.placement.overlap_reduction);
  EXPECT_FALSE(ShardsParameters(dp));
}

TEST(SpecParserTest, ShardLevels) {
  auto with = [](const std::string& lines) {
    return Edit(kBase, "  workers: 2\n", absl::StrCat("  workers: 2\n  replicas: 2\n", lines));
  };
  EXPECT_EQ(Parsed(with("  shard: none\n")).placement.shard, ShardLevel::kNone);
  EXPECT_EQ(Parsed(with("  shard: optimizer\n")).placement.shard, ShardLevel::kOptimizer);
  EXPECT_EQ(Parsed(with("  shard: gradients\n")).placement.shard, ShardLevel::kGradients);
  const JobSpec zero3 = Parsed(with("  shard: parameters\n"));
  EXPECT_EQ(zero3.placement.shard, ShardLevel::kParameters);
  EXPECT_EQ(zero3.placement.unshard, "step");
  EXPECT_TRUE(ShardsParameters(zero3));
  EXPECT_EQ(Parsed(with("  shard: parameters\n  unshard: stage\n")).placement.unshard, "stage");
  // The synonym agrees with shard, or is an error.
  EXPECT_EQ(Parsed(with("  shard: optimizer\n  shard_optimizer: true\n")).placement.shard,
            ShardLevel::kOptimizer);
  EXPECT_EQ(Parsed(with("  shard: gradients\n  shard_optimizer: false\n")).placement.shard,
            ShardLevel::kGradients)
      << "false only says it is not exactly the optimizer level";
  EXPECT_THAT(Errors(with("  shard: gradients\n  shard_optimizer: true\n")),
              ElementsAre("placement.shard_optimizer: true contradicts placement.shard: gradients "
                          "(shard_optimizer: true is another name for shard: optimizer; give one "
                          "of them)"));
  EXPECT_THAT(Errors(with("  shard: everything\n")), ElementsAre(HasSubstr("placement.shard: ")));
  EXPECT_THAT(Errors(with("  shard: gradients\n  unshard: stage\n")),
              ElementsAre("placement.unshard: only with placement.shard: parameters (the "
                          "parameters of shard: gradients are never gathered for a stage's use)"));
  EXPECT_THAT(Errors(with("  shard: parameters\n  unshard: layer\n")),
              ElementsAre(HasSubstr("placement.unshard: ")));
  EXPECT_TRUE(
      Parsed(Edit(with("  shard: auto\n"), "kind: 1F1B", "kind: auto")).placement.shard_auto);
  EXPECT_THAT(Errors(with("  shard: auto\n")),
              ElementsAre("placement.shard: auto needs schedule.kind: auto (the plan search "
                          "chooses the level); name a level (none, optimizer, gradients, "
                          "parameters) for a named schedule"));
  // One replica: nothing is sharded.
  EXPECT_FALSE(ShardsParameters(
      Parsed(Edit(kBase, "  workers: 2\n", "  workers: 2\n  shard: parameters\n"))));
}

TEST(SpecParserTest, DataParallelPlacementErrors) {
  // 8 rows cannot feed 3 replicas x 4 microbatches.
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2\n", "  workers: 2\n  replicas: 3\n")),
              ElementsAre("training.batch_size: must be >= schedule.microbatches x "
                          "placement.replicas (4 x 3 = 12: every replica runs that many "
                          "microbatches of at least one row), got 8"));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2\n", "  workers: 2\n  replicas: 0\n")),
              ElementsAre(HasSubstr("placement.replicas")));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2\n", "  workers: 2\n  shard_optimizer: 3\n")),
              ElementsAre(HasSubstr("placement.shard_optimizer")));
}

TEST(SpecParserTest, AdamwDefaults) {
  JobSpec spec = Parsed(Edit(kBase, "{kind: sgd, lr: 0.1}", "{kind: adamw}"));
  EXPECT_EQ(spec.training.optimizer.kind, "adamw");
  EXPECT_DOUBLE_EQ(spec.training.optimizer.lr, 0.001);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.eps, 1e-8);
}

TEST(SpecParserTest, AdamwOptionsGiven) {
  JobSpec spec = Parsed(Edit(kBase, "{kind: sgd, lr: 0.1}",
                             "{kind: adamw, lr: 1, weight_decay: 0, betas: [0.8, 0.95], "
                             "eps: 1e-6}"));
  EXPECT_DOUBLE_EQ(spec.training.optimizer.lr, 1.0);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(spec.training.optimizer.eps, 1e-6);
}

TEST(SpecParserTest, CsvSchedule) {
  JobSpec spec = Parsed(Edit(kBase, "  kind: 1F1B\n",
                             "  csv: my.csv\n  csv_format: compute_comms\n"
                             "  csv_text: |\n    0F0,0F1\n    ,1F0\n"));
  EXPECT_EQ(spec.schedule.kind, "");
  EXPECT_EQ(spec.schedule.csv, "my.csv");
  EXPECT_EQ(spec.schedule.csv_format, "compute_comms");
  EXPECT_EQ(spec.schedule.csv_text, "0F0,0F1\n,1F0\n");
}

TEST(SpecParserTest, EveryOptionalSectionGiven) {
  JobSpec spec = Parsed(absl::StrCat(
      Edit(Edit(Edit(kBase, "  workers: 2\n", "  workers: 2\n  style: v\n  device: cuda\n"),
                "  batch_size: 8\n",
                "  batch_size: 8\n  scale_grads: false\n  checkpoint: {dir: /c}\n"),
           "  kind: synthetic\n", "  kind: tensors\n  path: /data/t.pt\n  seed: 0x10\n"),
      "restart: {max_restarts: 3}\n"));
  EXPECT_EQ(spec.placement.style, "v");
  EXPECT_EQ(spec.placement.device, "cuda");
  EXPECT_FALSE(spec.training.scale_grads);
  EXPECT_EQ(spec.training.checkpoint.dir, "/c");
  EXPECT_EQ(spec.data.kind, "tensors");
  EXPECT_EQ(spec.data.path, "/data/t.pt");
  EXPECT_EQ(spec.data.seed, 16u);
  EXPECT_EQ(spec.restart.max_restarts, 3);
}

TEST(SpecParserTest, ResumeFromTakesADirectoryOrItsManifest) {
  const auto with = [](const std::string& value) {
    return Edit(kBase, "  optimizer: {kind: sgd, lr: 0.1}\n",
                absl::StrCat("  optimizer: {kind: sgd, lr: 0.1}\n  resume_from: ", value, "\n"));
  };
  EXPECT_EQ(Parsed(with("/ckpt/step-000005")).training.resume_from, "/ckpt/step-000005");
  EXPECT_EQ(Parsed(with("/ckpt/step-000005/manifest.json")).training.resume_from,
            "/ckpt/step-000005");
  EXPECT_THAT(Errors(with("''")), ElementsAre("training.resume_from: must be a non-empty path"));
}

TEST(SpecParserTest, DataSeqIsForTokensOnly) {
  EXPECT_EQ(Parsed(Edit(kBase, "  kind: synthetic\n", "  kind: tokens\n  path: t.bin\n  seq: 32\n"))
                .data.seq,
            32);
  EXPECT_THAT(Errors(Edit(kBase, "  kind: synthetic\n", "  kind: synthetic\n  seq: 32\n")),
              ElementsAre("data.seq: only used by data.kind tokens or jsonl"));
}

TEST(SpecParserTest, NullValueCountsAsAbsent) {
  JobSpec spec = Parsed(Edit(kBase, "placement:\n  workers: 2\n", "placement:\n  # workers: 2\n"));
  EXPECT_EQ(spec.placement.workers, 0);
  EXPECT_EQ(spec.placement.device, "cpu");
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: ~")), ElementsAre("name: required"));
}

// ---------------------------------------------------------------------------------------------
// Document-level errors.

TEST(SpecParserTest, InvalidYamlHasLineAndColumn) {
  EXPECT_THAT(Errors("name: x\nmodel: [1, 2\n", "job.yaml"),
              ElementsAre("job.yaml:3:1: invalid YAML: end of sequence flow not found"));
  EXPECT_THAT(Errors("name: a: b\n", "job.yaml"),
              ElementsAre("job.yaml:1:8: invalid YAML: illegal map value"));
  EXPECT_THAT(Errors("name: x\nmodel:\n\t- 1\n", "job.yaml"),
              ElementsAre("job.yaml:3:2: invalid YAML: illegal block entry"));
}

TEST(SpecParserTest, EmptyDocument) {
  EXPECT_THAT(Errors("", "job.yaml"),
              ElementsAre("job.yaml: the spec is empty; expected a mapping with keys name, model, "
                          "split, schedule, placement, training, data, restart, eval"));
  EXPECT_THAT(Errors("# nothing\n", "job.yaml"),
              ElementsAre(HasSubstr("job.yaml: the spec is empty")));
  EXPECT_THAT(Errors("~\n", "job.yaml"), ElementsAre(HasSubstr("job.yaml: the spec is empty")));
}

TEST(SpecParserTest, DocumentNotAMapping) {
  EXPECT_THAT(Errors("- name: x\n", "job.yaml"),
              ElementsAre("job.yaml: the spec must be a mapping with keys name, model, split, "
                          "schedule, placement, training, data, restart, eval; got a list"));
  EXPECT_THAT(Errors("just text\n"), ElementsAre(HasSubstr("; got 'just text'")));
}

TEST(SpecParserTest, MoreThanOneDocument) {
  EXPECT_THAT(Errors(absl::StrCat(kBase, "---\n", kBase), "job.yaml"),
              ElementsAre("job.yaml: expected one YAML document, got 2"));
}

// ---------------------------------------------------------------------------------------------
// Keys.

TEST(SpecParserTest, UnknownKeyListsValidKeysAndSuggests) {
  EXPECT_THAT(Errors(Edit(kBase, "  kind: 1F1B", "  kindd: 1F1B")),
              ElementsAre("schedule.kindd: unknown key (valid keys: kind, microbatches, csv, "
                          "csv_format, csv_text); did you mean 'kind'?",
                          "schedule: exactly one of 'kind' or 'csv' is required"));
  EXPECT_THAT(Errors(Edit(kBase, "microbatches: 4", "microbatchs: 4")),
              ElementsAre("schedule.microbatchs: unknown key (valid keys: kind, microbatches, "
                          "csv, csv_format, csv_text); did you mean 'microbatches'?"));
  // A transposition is one edit.
  EXPECT_THAT(Errors(Edit(kBase, "microbatches: 4", "mircobatches: 4")),
              ElementsAre(HasSubstr("; did you mean 'microbatches'?")));
  // Nothing within distance 2: no suggestion.
  EXPECT_THAT(Errors(Edit(kBase, "microbatches: 4", "chunks: 4")),
              ElementsAre("schedule.chunks: unknown key (valid keys: kind, microbatches, csv, "
                          "csv_format, csv_text)"));
}

TEST(SpecParserTest, UnknownTopLevelKey) {
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: test-job\nnmae: x")),
              ElementsAre("nmae: unknown key (valid keys: name, model, split, schedule, "
                          "placement, training, data, restart, eval); did you mean 'name'?"));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "Restart: {max_restarts: 1}\n")),
              ElementsAre(HasSubstr("Restart: unknown key (valid keys: ")));
}

TEST(SpecParserTest, CarryOnIsOnWithReplicasUnlessTheOptimizerIsSharded) {
  auto spec = [](const std::string& placement, const std::string& restart) {
    return ParseJobSpec(absl::StrCat(Edit(kBase, "  workers: 2", placement), restart), "s.yaml");
  };
  auto plain = spec("  workers: 2", "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(CarriesOn(*plain)) << "one replica: nothing to carry on with";
  auto replicated = spec("  workers: 2\n  replicas: 2", "");
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  EXPECT_TRUE(CarriesOn(*replicated));
  auto sharded = spec("  workers: 2\n  replicas: 2\n  shard_optimizer: true", "");
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_FALSE(CarriesOn(*sharded)) << "a lost shard of the optimizer state is nowhere else";
  auto off = spec("  workers: 2\n  replicas: 2", "restart: {carry_on: false}\n");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(CarriesOn(*off));
  EXPECT_THAT(Errors(absl::StrCat(Edit(kBase, "  workers: 2",
                                       "  workers: 2\n  replicas: 2\n  shard_optimizer: true"),
                                  "restart: {carry_on: true}\n")),
              ElementsAre(HasSubstr("restart.carry_on: not supported with "
                                    "placement.shard: optimizer")));
}

TEST(SpecParserTest, SnapshotsAndSpares) {
  auto spec =
      ParseJobSpec(Edit(Edit(kBase, "  workers: 2", "  workers: 2\n  spares: 1"),
                        "  batch_size: 8\n", "  batch_size: 8\n  snapshot: {every_steps: 5}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->placement.spares, 1);
  EXPECT_EQ(spec->training.snapshot.every_steps, 5);
  EXPECT_THAT(Errors(Edit(Edit(kBase, "  workers: 2", "  workers: 2\n  replicas: 2"),
                          "  batch_size: 8\n", "  batch_size: 8\n  snapshot: {every_steps: 5}\n")),
              ElementsAre(HasSubstr("training.snapshot.every_steps: not supported with "
                                    "placement.replicas > 1")));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 2\n  spares: -1")),
              ElementsAre(HasSubstr("placement.spares")));
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  snapshot: {every: 5}\n")),
              ElementsAre(HasSubstr("training.snapshot.every: unknown key")));
}

TEST(SpecParserTest, UnknownKeysInEveryNestedMapping) {
  EXPECT_THAT(Errors(Edit(kBase, "sizes: [8, 16, 16, 16, 4]", "sizes: [8, 4], sead: 1")),
              ElementsAre("model.builtin.sead: unknown key (valid keys: family, sizes, seed); "
                          "did you mean 'seed'?"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: 0.1, moment: 0.5")),
              ElementsAre("training.optimizer.moment: unknown key (valid keys: kind, lr, "
                          "weight_decay, momentum); did you mean 'momentum'?"));
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n",
                          "  batch_size: 8\n  checkpoint: {dir: /c, every: 5}\n")),
              ElementsAre("training.checkpoint.every: unknown key (valid keys: dir, "
                          "every_steps, async)"));
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  stages: 2\n  polcy: profiled")),
              ElementsAre("split.polcy: unknown key (valid keys: stages, points, policy); "
                          "did you mean 'policy'?"));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 2\n  gpus: 2")),
              ElementsAre("placement.gpus: unknown key (valid keys: workers, device, style, "
                          "transport, replicas, shard, shard_optimizer, unshard, "
                          "overlap_reduction, memory_limit, spares)"));
  EXPECT_THAT(
      Errors(Edit(kBase, "  kind: synthetic", "  kind: synthetic\n  seeed: 1")),
      ElementsAre("data.seeed: unknown key (valid keys: kind, path, seed, seq, dtype, packing, "
                  "eos, tokenizer, fields, overlong); did you mean 'seed'?"));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "restart: {max_restart: 1}\n")),
              ElementsAre("restart.max_restart: unknown key (valid keys: max_restarts, carry_on, "
                          "elastic, min_workers, wait); did you mean 'max_restarts'?"));
  EXPECT_THAT(
      Errors(Edit(kBase, "  builtin:", "  bultin:")),
      ElementsAre("model.bultin: unknown key (valid keys: torchscript, builtin, hf); did you "
                  "mean 'builtin'?",
                  "model: exactly one of 'torchscript', 'builtin' or 'hf' is required"));
}

TEST(SpecParserTest, DuplicateKey) {
  EXPECT_THAT(Errors(Edit(kBase, "  microbatches: 4", "  microbatches: 4\n  microbatches: 2")),
              ElementsAre("schedule.microbatches: duplicate key"));
}

TEST(SpecParserTest, NonScalarKey) {
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  [a, b]: 2")),
              ElementsAre("placement: keys must be strings, got a list"));
}

TEST(SpecParserTest, SectionNotAMapping) {
  EXPECT_THAT(Errors(Edit(kBase, "placement:\n  workers: 2\n", "placement: 2\n")),
              ElementsAre("placement: must be a mapping, got '2'"));
  EXPECT_THAT(Errors(Edit(kBase, "{kind: sgd, lr: 0.1}", "[sgd]")),
              ElementsAre("training.optimizer: must be a mapping, got a list"));
}

// ---------------------------------------------------------------------------------------------
// name.

TEST(SpecParserTest, NameRules) {
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job\n", "")), ElementsAre("name: required"));
  const std::string pattern_error =
      "name: must match [a-z0-9]([a-z0-9-]*[a-z0-9])? (lowercase letters, digits and '-'), got ";
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: Test-Job")),
              ElementsAre(pattern_error + "'Test-Job'"));
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: test_job")),
              ElementsAre(pattern_error + "'test_job'"));
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: -job")),
              ElementsAre(pattern_error + "'-job'"));
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: job-")),
              ElementsAre(pattern_error + "'job-'"));
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: ''")), ElementsAre(pattern_error + "''"));
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: [a]")),
              ElementsAre("name: must be a string, got a list"));
  EXPECT_THAT(Errors(Edit(kBase, "name: test-job", "name: " + std::string(64, 'a'))),
              ElementsAre("name: must be at most 63 characters, got 64"));
  EXPECT_EQ(Parsed(Edit(kBase, "name: test-job", "name: " + std::string(63, 'a'))).name,
            std::string(63, 'a'));
  EXPECT_EQ(Parsed(Edit(kBase, "name: test-job", "name: 7")).name, "7");
  EXPECT_EQ(Parsed(Edit(kBase, "name: test-job", "name: a-1-b")).name, "a-1-b");
}

// ---------------------------------------------------------------------------------------------
// model.

TEST(SpecParserTest, ModelExactlyOne) {
  const std::string kError = "model: exactly one of 'torchscript', 'builtin' or 'hf' is required";
  EXPECT_THAT(
      Errors(Edit(kBase, "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 16, 4]}\n", "")),
      ElementsAre(kError));
  EXPECT_THAT(Errors(Edit(kBase, "  builtin:", "  torchscript: m.pt\n  builtin:")),
              ElementsAre(kError));
  EXPECT_THAT(Errors(Edit(kBase, "  builtin: {family: mlp, sizes: [8, 16, 16, 16, 4]}",
                          "  torchscript: ''")),
              ElementsAre("model.torchscript: must be a non-empty path"));
}

TEST(SpecParserTest, BuiltinFamily) {
  EXPECT_THAT(Errors(Edit(kBase, "family: mlp", "family: cnn")),
              ElementsAre("model.builtin.family: must be one of mlp, gpt, llama, got 'cnn'"));
  EXPECT_THAT(Errors(Edit(kBase, "family: mlp, ", "")),
              ElementsAre("model.builtin.family: required (mlp, gpt or llama)"));
  EXPECT_THAT(Errors(Edit(kBase, "{family: mlp, sizes: [8, 16, 16, 16, 4]}", "mlp")),
              ElementsAre("model.builtin: must be a mapping, got 'mlp'"));
}

TEST(SpecParserTest, MlpSizes) {
  EXPECT_THAT(Errors(Edit(kBase, "sizes: [8, 16, 16, 16, 4]", "sizes: [8, 16, 0, 4]")),
              ElementsAre("model.builtin.sizes[2]: must be >= 1, got 0"));
  EXPECT_THAT(
      Errors(Edit(kBase, "sizes: [8, 16, 16, 16, 4]", "sizes: [8]")),
      ElementsAre("model.builtin.sizes: must be a list of at least 2 integers, got 1 item"));
  EXPECT_THAT(Errors(Edit(kBase, "sizes: [8, 16, 16, 16, 4]", "sizes: 8")),
              ElementsAre("model.builtin.sizes: must be a list of at least 2 integers, got '8'"));
  EXPECT_THAT(Errors(Edit(kBase, ", sizes: [8, 16, 16, 16, 4]", "")),
              ElementsAre("model.builtin.sizes: required for family mlp"));
  EXPECT_THAT(Errors(Edit(kBase, "sizes: [8, 16, 16, 16, 4]", "sizes: [8, x, 2.5, 4]")),
              ElementsAre("model.builtin.sizes[1]: must be an integer, got 'x'",
                          "model.builtin.sizes[2]: must be an integer, got '2.5'"));
}

TEST(SpecParserTest, KeysOfTheOtherFamily) {
  EXPECT_THAT(Errors(Edit(kBase, "sizes: [8, 16, 16, 16, 4]",
                          "sizes: [8, 16, 16, 16, 4], vocab: 10, heads: 2")),
              ElementsAre("model.builtin.vocab: not a key of family mlp",
                          "model.builtin.heads: not a key of family mlp"));
  EXPECT_THAT(Errors(Edit(kBase, "{family: mlp, sizes: [8, 16, 16, 16, 4]}",
                          "{family: gpt, vocab: 16, d_model: 8, layers: 2, heads: 2, seq: 4, "
                          "sizes: [1, 2]}")),
              ElementsAre("model.builtin.sizes: not a key of family gpt"));
}

TEST(SpecParserTest, GptRules) {
  const std::string gpt = "{family: gpt, vocab: 16, d_model: 8, layers: 2, heads: 2, seq: 4}";
  const std::string base = Edit(kBase, "{family: mlp, sizes: [8, 16, 16, 16, 4]}", gpt);
  EXPECT_EQ(Parsed(base).model.builtin->layers, 2);
  EXPECT_THAT(Errors(Edit(base, "d_model: 8", "d_model: 9")),
              ElementsAre("model.builtin.d_model: must be divisible by model.builtin.heads (2), "
                          "got 9"));
  EXPECT_THAT(Errors(Edit(base, "vocab: 16, ", "")),
              ElementsAre("model.builtin.vocab: required for family gpt"));
  EXPECT_THAT(Errors(Edit(base, "layers: 2, heads: 2, seq: 4", "layers: 0, heads: -1, seq: 4")),
              ElementsAre("model.builtin.layers: must be >= 1, got 0",
                          "model.builtin.heads: must be >= 1, got -1"));
  EXPECT_THAT(Errors(Edit(base, "seq: 4", "seq: 4096, sead: 1")),
              ElementsAre("model.builtin.sead: unknown key (valid keys: family, vocab, d_model, "
                          "layers, heads, seq, seed, tie_embeddings); did you mean 'seed'?"));
}

TEST(SpecParserTest, BuiltinSeed) {
  EXPECT_EQ(Parsed(Edit(kBase, "family: mlp,", "family: mlp, seed: 18446744073709551615,"))
                .model.builtin->seed,
            18446744073709551615u);
  EXPECT_THAT(Errors(Edit(kBase, "family: mlp,", "family: mlp, seed: -1,")),
              ElementsAre("model.builtin.seed: must be >= 0, got -1"));
  EXPECT_THAT(Errors(Edit(kBase, "family: mlp,", "family: mlp, seed: 18446744073709551616,")),
              ElementsAre("model.builtin.seed: must be <= 18446744073709551615, got "
                          "18446744073709551616"));
}

TEST(SpecParserTest, BuiltinLayerNamesAndCount) {
  BuiltinModel mlp;
  mlp.family = "mlp";
  mlp.sizes = {32, 64, 64, 10};
  EXPECT_EQ(BuiltinLayerCount(mlp), 3);
  EXPECT_THAT(BuiltinLayerNames(mlp), ElementsAre("0", "1", "2"));

  BuiltinModel gpt;
  gpt.family = "gpt";
  gpt.layers = 3;
  EXPECT_EQ(BuiltinLayerCount(gpt), 6);
  EXPECT_THAT(BuiltinLayerNames(gpt),
              ElementsAre("embed", "blocks.0", "blocks.1", "blocks.2", "norm", "head"));

  BuiltinModel unknown;
  EXPECT_EQ(BuiltinLayerCount(unknown), 0);
  EXPECT_THAT(BuiltinLayerNames(unknown), IsEmpty());
}

// ---------------------------------------------------------------------------------------------
// split.

TEST(SpecParserTest, SplitStages) {
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  stages: 0")),
              ElementsAre("split.stages: must be >= 1, got 0"));
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  stages: 5")),
              ElementsAre("split.stages: must be <= 4 (the model's layers), got 5"));
  EXPECT_EQ(Parsed(Edit(kBase, "  stages: 2", "  stages: 4")).split.stages, 4);
  // Any number of stages for a TorchScript model: only a worker knows its layers.
  EXPECT_EQ(
      Parsed(Edit(Edit(kBase, "  stages: 2", "  stages: 50"),
                  "  builtin: {family: mlp, sizes: [8, 16, 16, 16, 4]}", "  torchscript: m.pt"))
          .split.stages,
      50);
}

TEST(SpecParserTest, SplitPoints) {
  JobSpec spec = Parsed(Edit(kBase, "  stages: 2", "  points: {\"1\": end, 3: beginning}"));
  EXPECT_THAT(spec.split.points, ElementsAre(Pair("1", "end"), Pair("3", "beginning")));

  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  stages: 2\n  points: {\"2\": end}")),
              ElementsAre("split: 'stages' and 'points' are mutually exclusive"));
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  points: {\"2\": middle}")),
              ElementsAre("split.points.2: must be 'beginning' or 'end', got 'middle'"));
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  points: {\"4\": end}")),
              ElementsAre("split.points.4: not a layer of the builtin model (its layers: 0, 1, 2, "
                          "3)"));
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  points: {}")),
              ElementsAre("split.points: must name at least one layer"));
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  points: [\"1\"]")),
              ElementsAre("split.points: must be a mapping, got a list"));
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  points: {\"\": end}")),
              ElementsAre("split.points: keys must be non-empty"));
}

TEST(SpecParserTest, SplitPointsOfBuiltinGpt) {
  const std::string gpt = Edit(kBase, "{family: mlp, sizes: [8, 16, 16, 16, 4]}",
                               "{family: gpt, vocab: 16, d_model: 8, layers: 2, heads: 2, seq: 4}");
  EXPECT_THAT(Parsed(Edit(gpt, "  stages: 2", "  points: {blocks.1: beginning, head: beginning}"))
                  .split.points,
              ElementsAre(Pair("blocks.1", "beginning"), Pair("head", "beginning")));
  EXPECT_THAT(Errors(Edit(gpt, "  stages: 2", "  points: {\"layers.4\": middle}")),
              ElementsAre("split.points.layers.4: must be 'beginning' or 'end', got 'middle'"));
  EXPECT_THAT(Errors(Edit(gpt, "  stages: 2", "  points: {\"layers.4\": beginning}")),
              ElementsAre("split.points.layers.4: not a layer of the builtin model (its layers: "
                          "embed, blocks.0, blocks.1, norm, head)"));
  EXPECT_THAT(Errors(Edit(gpt, "  stages: 2", "  points: {block.1: end, blocks.01: end}")),
              ElementsAre("split.points.block.1: not a layer of the builtin model (its layers: "
                          "embed, blocks.0, blocks.1, norm, head); did you mean 'blocks.1'?",
                          "split.points.blocks.01: not a layer of the builtin model (its layers: "
                          "embed, blocks.0, blocks.1, norm, head)"));
  // A long list is shortened in the message; no suggestion when several names are as close.
  EXPECT_THAT(Errors(Edit(Edit(gpt, "layers: 2", "layers: 96"), "  stages: 2",
                          "  points: {blocks.96: end}")),
              ElementsAre("split.points.blocks.96: not a layer of the builtin model (its layers: "
                          "embed, blocks.0, blocks.1, blocks.2, blocks.3, ..., blocks.95, norm, "
                          "head)"));
  EXPECT_THAT(Errors(Edit(gpt, "  stages: 2", "  stages: 6")),
              ElementsAre("split.stages: must be <= 5 (the model's layers), got 6"));
}

TEST(SpecParserTest, SplitPolicy) {
  EXPECT_EQ(Parsed(Edit(kBase, "  stages: 2", "  stages: 2\n  policy: profiled")).split.policy,
            "profiled");
  EXPECT_THAT(Errors(Edit(kBase, "  stages: 2", "  stages: 2\n  policy: equal")),
              ElementsAre("split.policy: must be one of equal-layers, equal-params, profiled, "
                          "memory, fewer-first-last, got 'equal'"));
  const JobSpec memory = Parsed(Edit(kBase, "  stages: 2", "  stages: 2\n  policy: memory"));
  EXPECT_EQ(memory.split.policy, "memory");
  EXPECT_TRUE(memory.split.policy_given);
  EXPECT_FALSE(Parsed(kBase).split.policy_given);
  EXPECT_EQ(
      Parsed(Edit(kBase, "  stages: 2", "  stages: 2\n  policy: fewer-first-last")).split.policy,
      "fewer-first-last");
}

TEST(SpecParserTest, AutoScheduleAndMemoryLimit) {
  const JobSpec autos =
      Parsed(Edit(Edit(kBase, "  kind: 1F1B\n  microbatches: 4\n", "  kind: auto\n"),
                  "  workers: 2\n", "  workers: 2\n  memory_limit: 1.5GiB\n"));
  EXPECT_TRUE(IsAutoSchedule(autos.schedule));
  EXPECT_FALSE(autos.schedule.microbatches_given);
  EXPECT_EQ(autos.placement.memory_limit_bytes, 1536LL << 20);
  EXPECT_TRUE(Parsed(kBase).schedule.microbatches_given);
  EXPECT_FALSE(IsAutoSchedule(Parsed(kBase).schedule));
  EXPECT_EQ(Parsed(Edit(kBase, "  workers: 2\n", "  workers: 2\n  memory_limit: 4096\n"))
                .placement.memory_limit_bytes,
            4096);
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2\n", "  workers: 2\n  memory_limit: lots\n")),
              ElementsAre(HasSubstr("placement.memory_limit: 'lots' is not a byte size")));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2\n", "  workers: 2\n  memory_limit: 0GiB\n")),
              ElementsAre("placement.memory_limit: must be more than 0 bytes"));
}

// ---------------------------------------------------------------------------------------------
// schedule.

TEST(SpecParserTest, ScheduleKindOrCsv) {
  const std::string kError = "schedule: exactly one of 'kind' or 'csv' is required";
  EXPECT_THAT(Errors(Edit(kBase, "  kind: 1F1B\n", "")), ElementsAre(kError));
  EXPECT_THAT(Errors(Edit(kBase, "schedule:\n  kind: 1F1B\n  microbatches: 4\n", "")),
              ElementsAre(kError));
  EXPECT_THAT(Errors(Edit(kBase, "  kind: 1F1B\n", "  kind: 1F1B\n  csv: s.csv\n")),
              ElementsAre(kError));
  EXPECT_THAT(Errors(Edit(kBase, "  kind: 1F1B\n", "  kind: ''\n")),
              ElementsAre("schedule.kind: must be a non-empty generator name"));
  EXPECT_THAT(Errors(Edit(kBase, "  kind: 1F1B\n", "  csv: ''\n")),
              ElementsAre("schedule.csv: must be a non-empty path"));
  // The generator name is the planner's to check.
  EXPECT_EQ(Parsed(Edit(kBase, "  kind: 1F1B\n", "  kind: NoSuchSchedule\n")).schedule.kind,
            "NoSuchSchedule");
}

TEST(SpecParserTest, ScheduleMicrobatches) {
  EXPECT_THAT(Errors(Edit(kBase, "microbatches: 4", "microbatches: 0")),
              ElementsAre("schedule.microbatches: must be >= 1, got 0"));
  EXPECT_THAT(Errors(Edit(kBase, "microbatches: 4", "microbatches: 16")),
              ElementsAre("schedule.microbatches: must be <= training.batch_size (8), got 16"));
  EXPECT_EQ(Parsed(Edit(kBase, "microbatches: 4", "microbatches: 8")).schedule.microbatches, 8);
  EXPECT_THAT(Errors(Edit(kBase, "microbatches: 4", "microbatches: 3000000000")),
              ElementsAre("schedule.microbatches: must be <= 2147483647, got 3000000000"));
}

TEST(SpecParserTest, ScheduleCsvOptionsNeedCsv) {
  EXPECT_THAT(Errors(Edit(kBase, "  kind: 1F1B\n", "  kind: 1F1B\n  csv_format: compute_only\n")),
              ElementsAre("schedule.csv_format: only valid with schedule.csv"));
  EXPECT_THAT(Errors(Edit(kBase, "  kind: 1F1B\n", "  kind: 1F1B\n  csv_text: 0F0\n")),
              ElementsAre("schedule.csv_text: only valid with schedule.csv"));
  EXPECT_THAT(Errors(Edit(kBase, "  kind: 1F1B\n", "  csv: s.csv\n  csv_format: comms\n")),
              ElementsAre("schedule.csv_format: must be one of compute_only, compute_comms, got "
                          "'comms'"));
}

// ---------------------------------------------------------------------------------------------
// placement.

TEST(SpecParserTest, PlacementRules) {
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 0")),
              ElementsAre("placement.workers: must be >= 1, got 0"));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 2\n  device: gpu")),
              ElementsAre("placement.device: must be one of cpu, cuda, got 'gpu'"));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 2\n  style: zigzag")),
              ElementsAre("placement.style: must be one of loop, v, got 'zigzag'"));
  EXPECT_EQ(Parsed(Edit(kBase, "  workers: 2", "  workers: 2\n  style: loop")).placement.style,
            "loop");
}

TEST(SpecParserTest, PlacementTransport) {
  EXPECT_EQ(Parsed(kBase).placement.transport, "auto");
  EXPECT_EQ(
      Parsed(Edit(kBase, "  workers: 2", "  workers: 2\n  transport: gloo")).placement.transport,
      "gloo");
  JobSpec nccl =
      Parsed(Edit(kBase, "  workers: 2", "  workers: 2\n  device: cuda\n  transport: nccl"));
  EXPECT_EQ(nccl.placement.transport, "nccl");
  EXPECT_EQ(nccl.placement.device, "cuda");
  EXPECT_EQ(Parsed(Edit(kBase, "  workers: 2", "  workers: 2\n  device: cuda\n  transport: gloo"))
                .placement.transport,
            "gloo");
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 2\n  transport: nccl")),
              ElementsAre("placement.transport: nccl needs placement.device cuda (device is cpu; "
                          "use gloo or auto)"));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 2\n  transport: mpi")),
              ElementsAre("placement.transport: must be one of auto, gloo, nccl, got 'mpi'"));
  // An invalid device is reported alone, without a derived transport error.
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 2\n  device: gpu\n  transport: nccl")),
              ElementsAre("placement.device: must be one of cpu, cuda, got 'gpu'"));
}

// ---------------------------------------------------------------------------------------------
// training.

TEST(SpecParserTest, BatchSize) {
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "")),
              ElementsAre("training.batch_size: required"));
  EXPECT_THAT(
      Errors(Edit(kBase, "training:\n  batch_size: 8\n  optimizer: {kind: sgd, lr: 0.1}\n", "")),
      ElementsAre("training.batch_size: required"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: abc")),
              ElementsAre("training.batch_size: must be an integer, got 'abc'"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: 2.5")),
              ElementsAre("training.batch_size: must be an integer, got '2.5'"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: \"8\"")),
              ElementsAre("training.batch_size: must be an integer, got '8' (a quoted string)"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: [8]")),
              ElementsAre("training.batch_size: must be an integer, got a list"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: 0")),
              ElementsAre("training.batch_size: must be >= 1, got 0"));
}

TEST(SpecParserTest, IntegersOutOfRangeAreErrorsNotWraparounds) {
  EXPECT_EQ(
      Parsed(Edit(kBase, "batch_size: 8", "batch_size: 9223372036854775807")).training.batch_size,
      9223372036854775807);
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: 9223372036854775808")),
              ElementsAre("training.batch_size: must be <= 9223372036854775807, got "
                          "9223372036854775808"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: 18446744073709551617")),
              ElementsAre("training.batch_size: must be <= 9223372036854775807, got "
                          "18446744073709551617"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: -99999999999999999999")),
              ElementsAre("training.batch_size: must be >= 1, got -99999999999999999999"));
  EXPECT_THAT(Errors(Edit(kBase, "  workers: 2", "  workers: 4294967298")),
              ElementsAre("placement.workers: must be <= 2147483647, got 4294967298"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: 0x8000000000000000")),
              ElementsAre("training.batch_size: must be <= 9223372036854775807, got "
                          "0x8000000000000000"));
}

TEST(SpecParserTest, IntegerForms) {
  EXPECT_EQ(Parsed(Edit(kBase, "batch_size: 8", "batch_size: 0x10")).training.batch_size, 16);
  EXPECT_EQ(Parsed(Edit(kBase, "batch_size: 8", "batch_size: 0o10")).training.batch_size, 8);
  EXPECT_EQ(Parsed(Edit(kBase, "batch_size: 8", "batch_size: +12")).training.batch_size, 12);
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: 8.0")),
              ElementsAre("training.batch_size: must be an integer, got '8.0'"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: 1e3")),
              ElementsAre("training.batch_size: must be an integer, got '1e3'"));
  EXPECT_THAT(Errors(Edit(kBase, "batch_size: 8", "batch_size: 0x")),
              ElementsAre("training.batch_size: must be an integer, got '0x'"));
}

TEST(SpecParserTest, StepsAndLoss) {
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  steps: 0\n")),
              ElementsAre("training.steps: must be >= 1, got 0"));
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  loss: l1\n")),
              ElementsAre("training.loss: must be one of mse, cross_entropy, got 'l1'"));
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  loss: MSE\n")),
              ElementsAre("training.loss: must be one of mse, cross_entropy, got 'MSE'"));
}

TEST(SpecParserTest, BooleansAreTrueOrFalse) {
  for (const char* yes : {"true", "True", "TRUE"}) {
    EXPECT_TRUE(Parsed(Edit(kBase, "  batch_size: 8\n",
                            absl::StrCat("  batch_size: 8\n  scale_grads: ", yes, "\n")))
                    .training.scale_grads);
  }
  for (const char* no : {"false", "False", "FALSE"}) {
    EXPECT_FALSE(Parsed(Edit(kBase, "  batch_size: 8\n",
                             absl::StrCat("  batch_size: 8\n  scale_grads: ", no, "\n")))
                     .training.scale_grads);
  }
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  scale_grads: yes\n")),
              ElementsAre("training.scale_grads: must be true or false, got 'yes'"));
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  scale_grads: 1\n")),
              ElementsAre("training.scale_grads: must be true or false, got '1'"));
  EXPECT_THAT(Errors(Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  scale_grads: 'true'\n")),
              ElementsAre("training.scale_grads: must be true or false, got 'true' (a quoted "
                          "string)"));
}

TEST(SpecParserTest, OptimizerKindAndNumbers) {
  EXPECT_THAT(Errors(Edit(kBase, "kind: sgd", "kind: adam")),
              ElementsAre("training.optimizer.kind: must be one of sgd, adamw, got 'adam'"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: 0")),
              ElementsAre("training.optimizer.lr: must be > 0, got 0"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: -1e-3")),
              ElementsAre("training.optimizer.lr: must be > 0, got -1e-3"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: fast")),
              ElementsAre("training.optimizer.lr: must be a number, got 'fast'"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: '0.1'")),
              ElementsAre("training.optimizer.lr: must be a number, got '0.1' (a quoted string)"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: .inf")),
              ElementsAre("training.optimizer.lr: must be a finite number, got .inf"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: 1e999")),
              ElementsAre("training.optimizer.lr: must be a finite number, got 1e999"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: 0.1, weight_decay: -0.5")),
              ElementsAre("training.optimizer.weight_decay: must be >= 0, got -0.5"));
  for (const char* lr : {"1", ".5", "5.", "+2.5", "3.0e-4", "1E-3"}) {
    SCOPED_TRACE(lr);
    Parsed(Edit(kBase, "lr: 0.1", absl::StrCat("lr: ", lr)));
  }
  EXPECT_DOUBLE_EQ(Parsed(Edit(kBase, "lr: 0.1", "lr: 1")).training.optimizer.lr, 1.0);
}

TEST(SpecParserTest, SgdMomentum) {
  EXPECT_DOUBLE_EQ(
      Parsed(Edit(kBase, "lr: 0.1", "lr: 0.1, momentum: 0")).training.optimizer.momentum, 0.0);
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: 0.1, momentum: 1.0")),
              ElementsAre("training.optimizer.momentum: must be in [0, 1), got 1.0"));
  EXPECT_THAT(Errors(Edit(kBase, "lr: 0.1", "lr: 0.1, momentum: -0.1")),
              ElementsAre("training.optimizer.momentum: must be in [0, 1), got -0.1"));
  EXPECT_THAT(Errors(Edit(kBase, "{kind: sgd, lr: 0.1}", "{kind: adamw, momentum: 0.9}")),
              ElementsAre("training.optimizer.momentum: not a key of optimizer adamw"));
  // sgd is the default kind.
  EXPECT_THAT(Errors(Edit(kBase, "{kind: sgd, lr: 0.1}", "{betas: [0.9, 0.99], eps: 1e-6}")),
              ElementsAre("training.optimizer.betas: not a key of optimizer sgd",
                          "training.optimizer.eps: not a key of optimizer sgd"));
}

TEST(SpecParserTest, AdamwBetasAndEps) {
  const std::string adamw = Edit(kBase, "{kind: sgd, lr: 0.1}", "{kind: adamw, betas: BETAS}");
  EXPECT_THAT(Errors(Edit(adamw, "BETAS", "[0.9, 0.99, 0.999]")),
              ElementsAre("training.optimizer.betas: must be a list of two numbers, got 3 items"));
  EXPECT_THAT(Errors(Edit(adamw, "BETAS", "0.9")),
              ElementsAre("training.optimizer.betas: must be a list of two numbers, got '0.9'"));
  EXPECT_THAT(Errors(Edit(adamw, "BETAS", "[0.9, 1.0]")),
              ElementsAre("training.optimizer.betas[1]: must be in [0, 1), got 1.0"));
  EXPECT_THAT(Errors(Edit(adamw, "BETAS", "[x, -0.1]")),
              ElementsAre("training.optimizer.betas[0]: must be a number, got 'x'",
                          "training.optimizer.betas[1]: must be in [0, 1), got -0.1"));
  EXPECT_THAT(Errors(Edit(adamw, "betas: BETAS", "eps: 0")),
              ElementsAre("training.optimizer.eps: must be > 0, got 0"));
}

TEST(SpecParserTest, Checkpoint) {
  const std::string with = Edit(kBase, "  batch_size: 8\n", "  batch_size: 8\n  checkpoint: CK\n");
  EXPECT_EQ(Parsed(Edit(with, "CK", "{dir: /c, every_steps: 0}")).training.checkpoint.every_steps,
            0);
  EXPECT_THAT(Errors(Edit(with, "CK", "{dir: /c, every_steps: -1}")),
              ElementsAre("training.checkpoint.every_steps: must be >= 0, got -1"));
  EXPECT_THAT(Errors(Edit(with, "CK", "{every_steps: 10}")),
              ElementsAre("training.checkpoint.every_steps: only valid with "
                          "training.checkpoint.dir"));
  EXPECT_THAT(Errors(Edit(with, "CK", "{dir: [a]}")),
              ElementsAre("training.checkpoint.dir: must be a string, got a list"));
  // Asynchronous writes by default; `async: false` writes on the step loop.
  EXPECT_TRUE(Parsed(Edit(with, "CK", "{dir: /c}")).training.checkpoint.async);
  EXPECT_FALSE(Parsed(Edit(with, "CK", "{dir: /c, async: false}")).training.checkpoint.async);
  EXPECT_THAT(Errors(Edit(with, "CK", "{dir: /c, async: sometimes}")),
              ElementsAre(::testing::HasSubstr("training.checkpoint.async")));
}

// ---------------------------------------------------------------------------------------------
// data and restart.

TEST(SpecParserTest, DataRules) {
  EXPECT_THAT(
      Errors(Edit(kBase, "kind: synthetic", "kind: images")),
      ElementsAre("data.kind: must be one of synthetic, tokens, jsonl, tensors, got 'images'"));
  EXPECT_THAT(Errors(Edit(kBase, "kind: synthetic", "kind: tokens")),
              ElementsAre("data.path: required for data.kind tokens"));
  EXPECT_THAT(Errors(Edit(kBase, "kind: synthetic", "kind: tensors\n  path: ''")),
              ElementsAre("data.path: must be a non-empty path"));
  EXPECT_THAT(Errors(Edit(kBase, "kind: synthetic", "path: train.bin")),
              ElementsAre("data.path: not used by data.kind synthetic (use kind tokens or "
                          "tensors)"));
  EXPECT_THAT(Errors(Edit(kBase, "kind: synthetic", "kind: synthetic\n  seed: -5")),
              ElementsAre("data.seed: must be >= 0, got -5"));
  EXPECT_THAT(Errors(Edit(kBase, "kind: synthetic", "kind: synthetic\n  seed: 1.5")),
              ElementsAre("data.seed: must be an integer, got '1.5'"));
  EXPECT_EQ(Parsed(Edit(kBase, "kind: synthetic", "kind: tokens\n  path: t.bin")).data.path,
            "t.bin");
}

TEST(SpecParserTest, RestartRules) {
  EXPECT_EQ(Parsed(absl::StrCat(kBase, "restart: {max_restarts: 0}\n")).restart.max_restarts, 0);
  EXPECT_THAT(Errors(absl::StrCat(kBase, "restart: {max_restarts: -1}\n")),
              ElementsAre("restart.max_restarts: must be >= 0, got -1"));
  EXPECT_THAT(Errors(absl::StrCat(kBase, "restart: 3\n")),
              ElementsAre("restart: must be a mapping, got '3'"));
}

// ---------------------------------------------------------------------------------------------
// Many errors at once.

TEST(SpecParserTest, ReportsEveryErrorTogether) {
  EXPECT_THAT(Errors(R"(name: Bad_Name
model:
  builtin: {family: mlp, sizes: [4, 0], vocab: 3}
split:
  stages: 0
  policy: fastest
schedule:
  kindd: 1F1B
  microbatches: 0
placement:
  device: tpu
training:
  batch_size: abc
  loss: l1
  optimizer: {kind: adamw, momentum: 0.9, lr: -1}
data:
  kind: tokens
extra: 1
)"),
              ElementsAre("extra: unknown key (valid keys: name, model, split, schedule, "
                          "placement, training, data, restart, eval)",
                          "name: must match [a-z0-9]([a-z0-9-]*[a-z0-9])? (lowercase letters, "
                          "digits and '-'), got 'Bad_Name'",
                          "model.builtin.vocab: not a key of family mlp",
                          "model.builtin.sizes[1]: must be >= 1, got 0",
                          "split.stages: must be >= 1, got 0",
                          "split.policy: must be one of equal-layers, equal-params, profiled, "
                          "memory, fewer-first-last, got 'fastest'",
                          "schedule.kindd: unknown key (valid keys: kind, microbatches, csv, "
                          "csv_format, csv_text); did you mean 'kind'?",
                          "schedule: exactly one of 'kind' or 'csv' is required",
                          "schedule.microbatches: must be >= 1, got 0",
                          "placement.device: must be one of cpu, cuda, got 'tpu'",
                          "training.batch_size: must be an integer, got 'abc'",
                          "training.loss: must be one of mse, cross_entropy, got 'l1'",
                          "training.optimizer.momentum: not a key of optimizer adamw",
                          "training.optimizer.lr: must be > 0, got -1",
                          "data.path: required for data.kind tokens"));
}

TEST(SpecParserTest, CrossFieldCheckOnlyWhenBothFieldsAreValid) {
  // An invalid batch size is reported once, without a second, derived error.
  EXPECT_THAT(Errors(Edit(Edit(kBase, "microbatches: 4", "microbatches: 100"), "batch_size: 8",
                          "batch_size: x")),
              ElementsAre("training.batch_size: must be an integer, got 'x'"));
}

}  // namespace
}  // namespace stagecoach::spec::spec_parser_test
