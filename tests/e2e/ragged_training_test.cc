// Ragged text across worker processes: a built-in GPT trains on a tokens file of documents of
// every length with the loss normalised by tokens (the default for tokens data), with
// data.packing pad (a row is one document, each microbatch padded to its own longest row) on
// 1F1B, Interleaved1F1B, ZBVZeroBubble and 1F1B on 2 replicas, and with pack (a row is whole
// documents, each attending within itself from position 0) on Interleaved1F1B, ZBVZeroBubble
// and 2 replicas. Every step's loss and every final parameter equal one unpipelined step per
// global batch of the GPT of tests/support/reference_gpt.h, which runs every document of the
// rows of tests/support/reference_documents.h alone, from the job's own step-0 export, within
// rtol 1e-5 + atol 1e-6: whatever the microbatches and replicas hold, the step is the whole
// batch's sum of token losses over its count of tokens. So does a validation pass after the last
// step (on 2 replicas and on ZBVZeroBubble): the trained reference's loss over the eval batches
// normalised by their tokens. `stagectl watch` shows each step's padding waste as the
// microbatches' longest rows make it.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/local_cluster.h"
#include "tests/support/python.h"
#include "tests/support/reference_documents.h"
#include "tests/support/reference_gpt.h"
#include "tests/support/stage_files.h"
#include "tests/support/step_zero.h"

namespace stagecoach::testing::ragged_training_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 3;
constexpr int64_t kVocab = 32;
constexpr int64_t kEos = 31;
constexpr int64_t kSeq = 8;
constexpr uint64_t kDataSeed = 5;

// 300 documents of 1 to 10 tokens below the EOS, each ending with it: many shorter than seq,
// some longer (cut to seq).
std::vector<int64_t> DocumentTokens() {
  std::mt19937 rng(2024);
  std::vector<int64_t> tokens;
  for (int d = 0; d < 300; ++d) {
    const int len = 1 + static_cast<int>(rng() % 10);
    for (int i = 0; i < len; ++i) tokens.push_back(static_cast<int64_t>(rng() % kEos));
    tokens.push_back(kEos);
  }
  return tokens;
}

std::string Uint16Bytes(const std::vector<int64_t>& tokens) {
  std::string bytes;
  for (int64_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  return bytes;
}

struct Case {
  std::string name;
  std::string schedule;
  int workers;
  int stages;
  int replicas;
  std::string packing = "pad";
  // A validation pass after the last step on kEvalBatches batches of the same documents drawn
  // with kEvalSeed.
  bool eval = false;
};

constexpr uint64_t kEvalSeed = 77;
constexpr int64_t kEvalBatches = 2;

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string Spec(const Case& c, const std::string& data, const std::string& ckpt) {
  return absl::StrCat(
      "name: ", c.name, "\n", "model:\n  builtin: {family: gpt, vocab: ", kVocab,
      ", d_model: 16, layers: 2, heads: 2, "
      "seq: ",
      kSeq, ", seed: 4}\n", "split: {stages: ", c.stages, "}\n", "schedule: {kind: ", c.schedule,
      ", microbatches: 4}\n", "placement: {workers: ", c.workers, ", replicas: ", c.replicas, "}\n",
      "training:\n  batch_size: 8\n  steps: ", kSteps, "\n  loss: cross_entropy\n",
      "  optimizer: {kind: sgd, lr: 0.1, momentum: 0.9}\n", "  checkpoint: {dir: ", ckpt, "}\n",
      "data: {kind: tokens, path: ", data, ", seed: ", kDataSeed, ", eos: ", kEos,
      ", packing: ", c.packing, "}\n",
      c.eval ? absl::StrCat("eval: {every_steps: ", kSteps, ", batches: ", kEvalBatches,
                            ", data: {kind: tokens, path: ", data, ", seed: ", kEvalSeed,
                            ", eos: ", kEos, ", packing: ", c.packing, "}}\n")
             : "");
}

// The spec's GPT, unpipelined, from the job's step-0 export in `ckpt` (its `stages` stages).
GptReferenceConfig Reference(const std::string& ckpt, int stages) {
  return SmallSgdGptReference(kVocab, kSeq, LoadAllStageFiles(ckpt, 0, stages));
}

// The job's losses and final parameters (its last checkpoint in `ckpt`) against `want`; the
// largest parameter difference.
double ExpectLikeReference(const v1::Job& done, const GptReferenceResult& want,
                           const std::string& ckpt, int stages) {
  EXPECT_EQ(done.losses_size(), kSteps);
  for (int64_t k = 0; k < kSteps && k < done.losses_size(); ++k) {
    EXPECT_NEAR(done.losses(k), want.losses[k], kAtol + kRtol * std::abs(want.losses[k]))
        << "step " << k;
  }
  const std::map<std::string, torch::Tensor> final_params = LoadAllStageFiles(ckpt, kSteps, stages);
  EXPECT_EQ(final_params.size(), want.params.size());
  double largest = 0;
  for (const auto& [name, p] : want.params) {
    if (final_params.count(name) == 0) {
      ADD_FAILURE() << "no " << name << " in the job's checkpoint";
      continue;
    }
    const double diff = (final_params.at(name) - p).abs().max().item<double>();
    largest = std::max(largest, diff);
    EXPECT_TRUE(torch::allclose(final_params.at(name), p, kRtol, kAtol)) << name << " by " << diff;
  }
  return largest;
}

class RaggedTraining : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { setenv("OMP_NUM_THREADS", "1", 1); }
};

TEST_P(RaggedTraining, DocumentRowsTrainLikeOneUnpipelinedStepOnTheWholeBatch) {
  const Case& c = GetParam();
  ClusterOptions options;
  options.workers = c.workers * c.replicas;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& cl = **cluster;
  const std::vector<int64_t> tokens = DocumentTokens();
  const std::string data = cl.WriteFile("docs.bin", Uint16Bytes(tokens));
  const std::string ckpt = cl.dir() + "/ckpt";
  const std::string spec = cl.WriteFile("spec.yaml", Spec(c, data, ckpt));

  v1::Job done;
  ASSERT_NO_FATAL_FAILURE(RunFromAStepZeroCheckpoint(cl, spec, &done));

  const GptReferenceConfig ref = Reference(ckpt, c.stages);
  std::vector<DocumentBatch> batches;
  int64_t padded = 0, counted = 0;
  for (int64_t k = 0; k < kSteps; ++k) {
    batches.push_back(
        ReferenceDocumentRows(tokens, kEos, c.packing == "pack", 8, kSeq, kDataSeed, k));
    counted += batches.back().targets.ne(kReferenceIgnored).sum().item<int64_t>();
    padded += batches.back().targets.numel();
  }
  // Padded rows are ragged (a fixed window would have padded a good share of them); packed rows
  // hold several documents.
  if (c.packing == "pad") {
    EXPECT_LT(counted, padded * 3 / 4) << "the documents are not ragged enough to test anything";
  } else {
    EXPECT_GT(batches[0].segments.max().item<int64_t>(), 0) << "no row holds two documents";
  }
  const GptReferenceResult want = TrainGptReferenceOnBatches(ref, batches);
  const double largest = ExpectLikeReference(done, want, ckpt, c.stages);
  EXPECT_FALSE(torch::equal(LoadAllStageFiles(ckpt, kSteps, c.stages).at("head.weight"),
                            ref.initial.at("head.weight")))
      << "it did not train";
  if (c.eval) {
    // The validation pass after the last step: the trained model's loss over the eval batches
    // (every replica's share) normalised by their tokens, not the mean of microbatch means.
    std::vector<DocumentBatch> eval_batches;
    for (int64_t j = 0; j < kEvalBatches; ++j) {
      eval_batches.push_back(
          ReferenceDocumentRows(tokens, kEos, c.packing == "pack", 8, kSeq, kEvalSeed, j));
    }
    const double want_eval = GptReferenceTokenLoss(ref, want.params, eval_batches);
    ASSERT_EQ(done.evals_size(), 1);
    EXPECT_EQ(done.evals(0).global_step(), kSteps - 1);
    EXPECT_NEAR(done.evals(0).loss(), want_eval, kAtol + kRtol * want_eval);
  }

  // Each microbatch ran padded to its own longest row: `stagectl watch` shows the share of the
  // positions computed that were padding, which a fixed window would not have had so low.
  CommandResult watch = cl.Stagectl({"watch", done.id(), "-o", "json"});
  ASSERT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  std::vector<double> waste;
  for (absl::string_view line : absl::StrSplit(watch.out, '\n', absl::SkipEmpty())) {
    const nlohmann::json event = nlohmann::json::parse(std::string(line), nullptr, false);
    if (event.is_discarded() || event.value("event", "") != "step_completed") continue;
    waste.push_back(event.at("padding_waste").get<double>());
    EXPECT_GT(event.at("tokens_per_second").get<double>(), 0) << line;
  }
  ASSERT_EQ(waste.size(), static_cast<size_t>(kSteps)) << watch.out;
  const int64_t per_microbatch = 8 / (4 * c.replicas);
  for (int64_t k = 0; k < kSteps; ++k) {
    const torch::Tensor lengths = batches[k].segments.ne(-1).sum(1);
    int64_t computed = 0;
    for (int64_t first = 0; first < 8; first += per_microbatch) {
      computed += per_microbatch * lengths.slice(0, first, first + per_microbatch).max().item<int64_t>();
    }
    const double want_waste = 1.0 - lengths.sum().item<double>() / static_cast<double>(computed);
    EXPECT_NEAR(waste[k], want_waste, 1e-12) << "step " << k;
  }
  std::cerr << c.name << ": losses";
  for (double l : want.losses) std::cerr << " " << l;
  std::cerr << "; largest |parameter - reference| " << largest << "\n";
}

// Fine-tuning records (data.kind jsonl) packed into rows on ZBVZeroBubble: only the responses'
// tokens (and each record's EOS) count in the loss, a record longer than the window is skipped
// (data.overlong: skip) and the job's status counts it, and every step equals the reference on
// the same records, each record alone.
TEST(FineTuningRecords, OnlyTheResponsesCountAndOverlongRecordsAreSkipped) {
  if (!PythonCanImport("sentencepiece")) GTEST_SKIP() << "python3-sentencepiece is not installed";
  setenv("OMP_NUM_THREADS", "1", 1);
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& cl = **cluster;
  std::string corpus;
  for (int i = 0; i < 400; ++i) {
    absl::StrAppend(&corpus, "which stage runs on worker ", i % 9, "? stage ", i % 4,
                    " runs there and the loss fell.\n");
  }
  const std::string tokenizer_path = cl.dir() + "/tokenizer.model";
  const CommandResult trained = cl.Stagectl({"tokens", "train", cl.WriteFile("corpus.txt", corpus),
                                             "--vocab-size", "360", "--out", tokenizer_path});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;

  constexpr int64_t kWindow = 16;
  std::mt19937 rng(7);
  std::string lines;
  for (int i = 0; i < 60; ++i) {
    const std::string prompt = absl::StrCat("which stage runs on worker ", rng() % 9, "?");
    std::string response = absl::StrCat("stage ", rng() % 4);
    if (i % 15 == 7) absl::StrAppend(&response, " runs there and the loss fell and fell");
    absl::StrAppend(&lines, nlohmann::json{{"prompt", prompt}, {"response", response}}.dump(),
                    "\n");
  }
  const std::string data = cl.WriteFile("train.jsonl", lines);
  // The reference's records: python3-sentencepiece's ids of each record, BOS, prompt, response,
  // EOS, of which only the response and the EOS count.
  const std::string script =
      "import json, sys, sentencepiece as spm\n"
      "sp = spm.SentencePieceProcessor(model_file=sys.argv[1])\n"
      "for line in open(sys.argv[2], encoding='utf-8'):\n"
      "    r = json.loads(line)\n"
      "    p = [sp.bos_id()] + sp.encode(r['prompt'])\n"
      "    q = sp.encode(r['response']) + [sp.eos_id()]\n"
      "    print(' '.join(map(str, p)) + '\\t' + ' '.join(map(str, q)))\n";
  const CommandResult python =
      RunCommand({kPython, "-c", script, tokenizer_path, data}, absl::Seconds(60));
  ASSERT_EQ(python.exit_code, 0) << python.err;
  std::vector<ReferenceDocument> records;
  int skipped = 0;
  for (absl::string_view line : absl::StrSplit(python.out, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> parts = absl::StrSplit(line, '\t');
    ASSERT_EQ(parts.size(), 2u) << line;
    ReferenceDocument d;
    for (int part = 0; part < 2; ++part) {
      for (absl::string_view id : absl::StrSplit(parts[part], ' ', absl::SkipEmpty())) {
        d.tokens.push_back(std::stoll(std::string(id)));
        d.counted.push_back(part == 1);
      }
    }
    if (static_cast<int64_t>(d.tokens.size()) - 1 > kWindow) {
      ++skipped;
      continue;
    }
    records.push_back(std::move(d));
  }
  ASSERT_EQ(records.size() + skipped, 60u);
  ASSERT_GE(records.size(), 40u) << "too few records fit the window";
  ASSERT_GT(skipped, 0) << "no record is longer than the window";
  const std::string ckpt = cl.dir() + "/ckpt";
  const std::string spec = cl.WriteFile(
      "spec.yaml",
      absl::StrCat("name: fine-tune\nmodel:\n  builtin: {family: gpt, vocab: 360, d_model: 16, "
                   "layers: 2, heads: 2, seq: ",
                   kWindow, ", seed: 4}\n",
                   "split: {stages: 4}\nschedule: {kind: ZBVZeroBubble, microbatches: 4}\n",
                   "placement: {workers: 2}\n", "training:\n  batch_size: 8\n  steps: ", kSteps,
                   "\n  loss: cross_entropy\n",
                   "  optimizer: {kind: sgd, lr: 0.1, momentum: 0.9}\n",
                   "  checkpoint: {dir: ", ckpt, "}\n", "data: {kind: jsonl, path: ", data,
                   ", tokenizer: ", tokenizer_path, ", overlong: skip, seed: ", kDataSeed, "}\n"));
  v1::Job done;
  ASSERT_NO_FATAL_FAILURE(RunFromAStepZeroCheckpoint(cl, spec, &done));

  const GptReferenceConfig ref = SmallSgdGptReference(360, kWindow, LoadAllStageFiles(ckpt, 0, 4));
  std::vector<DocumentBatch> batches;
  for (int64_t k = 0; k < kSteps; ++k) {
    batches.push_back(ReferenceRows(records, /*pad=*/2, /*pack=*/true, 8, kWindow, kDataSeed, k));
  }
  // The prompts' targets do not count: fewer targets count than the rows hold positions.
  EXPECT_LT(batches[0].targets.ne(kReferenceIgnored).sum().item<int64_t>(),
            batches[0].segments.ne(-1).sum().item<int64_t>());
  const GptReferenceResult want = TrainGptReferenceOnBatches(ref, batches);
  ASSERT_EQ(done.losses_size(), kSteps);
  for (int64_t k = 0; k < kSteps; ++k) {
    EXPECT_NEAR(done.losses(k), want.losses[k], kAtol + kRtol * std::abs(want.losses[k]))
        << "step " << k;
  }
  const std::map<std::string, torch::Tensor> final_params = LoadAllStageFiles(ckpt, kSteps, 4);
  for (const auto& [name, p] : want.params) {
    ASSERT_EQ(final_params.count(name), 1u) << name;
    EXPECT_TRUE(torch::allclose(final_params.at(name), p, kRtol, kAtol)) << name;
  }
  // The status counts what the workers made of the file.
  ASSERT_TRUE(done.has_data_records()) << done.DebugString();
  EXPECT_EQ(done.data_records().read(), 60);
  EXPECT_EQ(done.data_records().skipped(), skipped);
  EXPECT_EQ(done.data_records().truncated(), 0);
  CommandResult status = cl.Stagectl({"status", done.id()});
  EXPECT_NE(status.out.find(absl::StrCat("Records:   60 read, 0 truncated, ", skipped, " skipped")),
            std::string::npos)
      << status.out;
}

INSTANTIATE_TEST_SUITE_P(Schedules, RaggedTraining,
                         ::testing::Values(
                             Case{"ragged-1f1b", "1F1B", 2, 2, 1},
                             Case{"ragged-interleaved", "Interleaved1F1B", 2, 4, 1},
                             Case{"ragged-zbv", "ZBVZeroBubble", 2, 4, 1},
                             Case{"ragged-replicas", "1F1B", 2, 2, 2, "pad", true},
                             Case{"packed-interleaved", "Interleaved1F1B", 2, 4, 1, "pack"},
                             Case{"packed-zbv", "ZBVZeroBubble", 2, 4, 1, "pack", true},
                             Case{"packed-replicas", "1F1B", 2, 2, 2, "pack"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.schedule,
                                               info.param.replicas > 1 ? "_2replicas" : "", "_",
                                               info.param.packing);
                         });

}  // namespace
}  // namespace stagecoach::testing::ragged_training_test
