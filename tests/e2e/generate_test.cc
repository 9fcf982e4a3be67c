// `stagectl generate` end to end: a built-in GPT (tied embeddings, ZBVZeroBubble, 4 stages on 2
// worker processes) trains on a tokens file; generation with temperature 0 from the finished
// job's final checkpoint (through a helper job) and from a paused job's current weights equals
// greedy decoding by the plain LibTorch reference (tests/support/reference_gpt.h) on the
// checkpointed weights; a seeded draw repeats; the paused job stays where it was and the helper
// job is cancelled afterwards. A running job, an MLP job, a prompt the vocabulary cannot
// encode and a paused job whose replicas shard their parameters (placement.shard: parameters)
// are refused, naming why.
#include <torch/torch.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_gpt.h"
#include "tests/support/stage_files.h"
#include "tests/support/token_files.h"

namespace stagecoach::testing::generate_test {
namespace {

using ::testing::HasSubstr;

constexpr int kVocab = 64;
constexpr int kSeq = 16;
constexpr int kSteps = 30;
constexpr int kNewTokens = 64;

// Token t is the character 0x30 + t ('0' .. 'o'): a vocabulary file in code point order.
std::string VocabJson() {
  nlohmann::json chars = nlohmann::json::array();
  for (int t = 0; t < kVocab; ++t) chars.push_back(std::string(1, static_cast<char>(0x30 + t)));
  return nlohmann::json{{"format", "stagecoach-chars"}, {"version", 1}, {"chars", chars}}.dump();
}

std::string TextOf(const std::vector<int64_t>& tokens) {
  std::string s;
  for (int64_t t : tokens) s.push_back(static_cast<char>(0x30 + t));
  return s;
}

// 20k tokens: 8 random sentences of 6 to 12 tokens, picked at random.
std::string TokenFile() { return PhraseTokenFile(2024, kVocab, 8, 6, 7, 20000); }

std::string GptSpec(const std::string& name, int64_t steps, const std::string& data,
                    const std::string& checkpoint_dir) {
  return absl::StrCat(
      "name: ", name, "\nmodel:\n  builtin: {family: gpt, vocab: ", kVocab,
      ", d_model: 32, layers: 2, heads: 4, seq: ", kSeq, ", seed: 3, tie_embeddings: true}\n",
      "split: {stages: 4}\nschedule: {kind: ZBVZeroBubble, microbatches: 4}\n",
      "placement: {workers: 2}\ntraining:\n  batch_size: 8\n  steps: ", steps,
      "\n  loss: cross_entropy\n  optimizer: {kind: adamw, lr: 3.0e-3}\n",
      checkpoint_dir.empty() ? "" : absl::StrCat("  checkpoint: {dir: ", checkpoint_dir, "}\n"),
      "data: {kind: tokens, path: ", data, ", seed: 5}\n");
}

GptReferenceConfig Reference() {
  GptReferenceConfig c;
  c.vocab = kVocab;
  c.d_model = 32;
  c.layers = 2;
  c.heads = 4;
  c.seq = kSeq;
  c.tied = true;
  return c;
}

struct Generated {
  std::vector<int64_t> tokens;
  std::string text, ran_on_job;
  int64_t weights_step = -1;
};

class GenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("OMP_NUM_THREADS", "1", 1);
    ClusterOptions options;
    options.workers = 2;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    data_ = cluster_->WriteFile("train.bin", TokenFile());
    vocab_ = cluster_->WriteFile("vocab.json", VocabJson());
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  // `stagectl -o json generate` with `args` after the job id; fails the test unless it exits 0.
  static Generated Generate(const std::string& job, const std::string& prompt,
                            const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"-o",       "json", "generate", job,
                                     "--prompt", prompt, "--vocab",  vocab_};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = cluster_->Stagectl(argv);
    Generated g;
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
    if (r.exit_code != 0) return g;
    const nlohmann::json json = nlohmann::json::parse(r.out);
    g.tokens = json.at("tokens").get<std::vector<int64_t>>();
    g.text = json.at("text").get<std::string>();
    g.ran_on_job = json.at("ran_on_job").get<std::string>();
    g.weights_step = json.at("weights_step").get<int64_t>();
    return g;
  }

  // Submits `spec` and waits until `state` (or an end).
  static absl::StatusOr<v1::Job> SubmitAndWait(const std::string& spec, bool paused,
                                               v1::JobState state) {
    return cluster_->SubmitAndWait(spec, paused, state, absl::Seconds(180));
  }

  static LocalCluster* cluster_;
  static std::string data_, vocab_;
};

LocalCluster* GenerateTest::cluster_ = nullptr;
std::string GenerateTest::data_;
std::string GenerateTest::vocab_;

TEST_F(GenerateTest, GreedyFromAFinishedJobsCheckpointEqualsTheReference) {
  const std::string ckpt = cluster_->dir() + "/ckpt-finished";
  auto done =
      SubmitAndWait(GptSpec("gpt-gen", kSteps, data_, ckpt), false, v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << cluster_->Logs();

  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5};
  const Generated got = Generate(done->id(), TextOf(prompt),
                                 {"--tokens", absl::StrCat(kNewTokens), "--temperature", "0"});
  const std::vector<int64_t> want =
      GreedyGptReference(Reference(), LoadAllStageFiles(ckpt, kSteps, 4), prompt, kNewTokens);
  EXPECT_EQ(got.tokens, want);
  EXPECT_EQ(got.text, TextOf(want));
  EXPECT_EQ(got.weights_step, kSteps);
  ASSERT_NE(got.ran_on_job, done->id());

  // The helper job that loaded the checkpoint was cancelled when the generation ended.
  auto helper = cluster_->WaitForJob(got.ran_on_job, IsFinal, absl::Seconds(30));
  ASSERT_TRUE(helper.ok()) << helper.status();
  EXPECT_EQ(helper->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(helper->reason(), HasSubstr("generate: done"));
  EXPECT_EQ(helper->name(), "gpt-gen-generate");

  // A seeded draw at temperature 1 among the top 5 repeats exactly.
  const std::vector<std::string> sampled = {"--tokens", "12", "--temperature", "1",
                                            "--top-k",  "5",  "--seed",        "42"};
  const Generated a = Generate(done->id(), TextOf(prompt), sampled);
  const Generated b = Generate(done->id(), TextOf(prompt), sampled);
  EXPECT_EQ(a.tokens.size(), 12u);
  EXPECT_EQ(a.tokens, b.tokens);
}

TEST_F(GenerateTest, GreedyFromAPausedJobUsesItsCurrentWeightsAndLeavesItPaused) {
  const std::string ckpt = cluster_->dir() + "/ckpt-paused";
  auto held = SubmitAndWait(GptSpec("gpt-paused", kSteps, data_, ckpt), true, v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason();
  const std::string id = held->id();
  CommandResult run = cluster_->Stagectl({"run", id, "--steps", "10"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  auto at10 = cluster_->WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.state() == v1::JOB_STATE_PAUSED && j.global_steps_done() == 10);
      },
      absl::Seconds(120));
  ASSERT_TRUE(at10.ok()) << at10.status();
  ASSERT_EQ(at10->state(), v1::JOB_STATE_PAUSED) << at10->reason();
  CommandResult checkpoint = cluster_->Stagectl({"checkpoint", id});
  ASSERT_EQ(checkpoint.exit_code, 0) << checkpoint.out << checkpoint.err;
  auto saved = cluster_->WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.checkpoints_size() > 0; },
      absl::Seconds(60));
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->checkpoints_size(), 1);
  ASSERT_EQ(saved->checkpoints(0).step(), 10);

  const std::vector<int64_t> prompt = {7, 7, 9};
  const Generated got = Generate(id, TextOf(prompt), {"--tokens", "20", "--temperature", "0"});
  EXPECT_EQ(got.tokens,
            GreedyGptReference(Reference(), LoadAllStageFiles(ckpt, 10, 4), prompt, 20));
  EXPECT_EQ(got.ran_on_job, id);
  EXPECT_EQ(got.weights_step, 10);

  auto after = cluster_->GetJob(id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(after->global_steps_done(), 10);
  EXPECT_EQ(after->steps_done(), 10);
  ASSERT_TRUE(cluster_->Cancel(id).ok());
}

TEST_F(GenerateTest, RefusesARunningJobAnMlpAndAPromptTheVocabularyLacks) {
  ASSERT_TRUE(cluster_->WaitForIdleWorkers(2, absl::Seconds(60)).ok());
  auto running = cluster_->Submit(GptSpec("gpt-long", 1000000, data_, ""));
  ASSERT_TRUE(running.ok()) << running.status();
  auto started = cluster_->WaitForJob(
      *running, [](const v1::Job& j) { return IsFinal(j) || j.steps_done() > 0; },
      absl::Seconds(120));
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_EQ(started->state(), v1::JOB_STATE_RUNNING) << started->reason();
  CommandResult r = cluster_->Stagectl(
      {"generate", *running, "--prompt", "123", "--vocab", vocab_, "--tokens", "3"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("is RUNNING; generate needs a PAUSED job"));
  EXPECT_THAT(r.err, HasSubstr("stagectl pause " + *running));
  ASSERT_TRUE(cluster_->Cancel(*running).ok());

  ASSERT_TRUE(cluster_->WaitForIdleWorkers(2, absl::Seconds(60)).ok());
  auto mlp = SubmitAndWait(
      "name: mlp\nmodel:\n  builtin: {family: mlp, sizes: [8, 8, 8, 8], seed: 1}\n"
      "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 2}\n"
      "training: {batch_size: 4, steps: 5}\n",
      true, v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  ASSERT_EQ(mlp->state(), v1::JOB_STATE_PAUSED) << mlp->reason();
  r = cluster_->Stagectl({"generate", mlp->id(), "--prompt", "123", "--vocab", vocab_});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("model is a built-in mlp; generate needs a built-in gpt"));
  // A character the vocabulary lacks is refused before any call: a usage error naming it.
  r = cluster_->Stagectl({"generate", mlp->id(), "--prompt", "hi~", "--vocab", vocab_});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("U+007E"));
  ASSERT_TRUE(cluster_->Cancel(mlp->id()).ok());
}

TEST_F(GenerateTest, RefusesAPausedJobWhoseReplicasShardTheirParameters) {
  // 2 ranks x 2 replicas: two more workers.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(cluster_->AddWorker().ok());
  ASSERT_TRUE(cluster_->WaitForIdleWorkers(4, absl::Seconds(60)).ok());
  std::string spec = GptSpec("gpt-sharded", kSteps, data_, "");
  const std::string placement = "placement: {workers: 2}";
  const std::string tied = "tie_embeddings: true";
  ASSERT_NE(spec.find(placement), std::string::npos);
  ASSERT_NE(spec.find(tied), std::string::npos);
  spec.replace(spec.find(placement), placement.size(),
               "placement: {workers: 2, replicas: 2, shard: parameters}");
  // Tied copies on two stages would shard differently (refused at submit).
  spec.replace(spec.find(tied), tied.size(), "tie_embeddings: false");
  auto held = SubmitAndWait(spec, true, v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason();
  const std::string id = held->id();
  CommandResult run = cluster_->Stagectl({"run", id, "--steps", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  auto at2 = cluster_->WaitForJob(
      id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.state() == v1::JOB_STATE_PAUSED && j.global_steps_done() == 2);
      },
      absl::Seconds(120));
  ASSERT_TRUE(at2.ok()) << at2.status();
  ASSERT_EQ(at2->state(), v1::JOB_STATE_PAUSED) << at2->reason() << cluster_->Logs();

  // Between steps each replica holds half of every stage: no worker can decode alone.
  CommandResult r =
      cluster_->Stagectl({"generate", id, "--prompt", "123", "--vocab", vocab_, "--tokens", "3"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("keeps its parameters sharded across the replicas"));
  EXPECT_THAT(r.err, HasSubstr("decode from a checkpoint instead"));
  auto after = cluster_->GetJob(id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::JOB_STATE_PAUSED) << after->reason();
  EXPECT_EQ(after->global_steps_done(), 2);
  ASSERT_TRUE(cluster_->Cancel(id).ok());
}

}  // namespace
}  // namespace stagecoach::testing::generate_test
