// Generation from the built-in Llama family end to end, with the key/value cache on every stage
// (WorkerService.Decode) and `stagectl generate --prompt-ids`: greedy tokens equal
// tests/support/reference_llama.h's greedy decoding without a cache on the checkpointed weights
// for 64 new tokens, for several prompts of different lengths decoded together:
//   llama  grouped-query attention, llama3 rope scaling, untied, ZBVZeroBubble (4 stages on 2
//          workers, the V puts stages 0 and 3 on one worker), a finished job's final checkpoint
//          through a helper job; max_position_embeddings 48, so the rows slide past it;
//   qwen3  per-head q/k RMSNorm, q/k/v biases off, tied embeddings across ranks, 1F1B on 2
//          workers, a paused job's current weights (step 0), which then trains on: decoding
//          leaves its timeline and its task's step gate as they were.
// A prompt outside the vocabulary, both kinds of prompt, an empty row, too many rows, ids that
// are not integers and text without a tokenizer are refused, naming the field.
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_llama.h"
#include "tests/support/stage_files.h"
#include "stagecoach/v1/generation.grpc.pb.h"

namespace stagecoach::testing::llama_generate_test {
namespace {

using ::testing::HasSubstr;

constexpr int kNewTokens = 64;

LlamaReferenceConfig Sizes() {
  LlamaReferenceConfig r;
  r.vocab = 40;
  r.hidden = 24;
  r.intermediate = 40;
  r.layers = 2;
  r.heads = 4;
  r.kv_heads = 4;
  r.head_dim = 6;
  r.seq = 8;
  return r;
}

std::string Spec(const std::string& name, const std::string& keys, const std::string& schedule,
                 int stages, int64_t steps, const std::string& ckpt) {
  return absl::StrCat(
      "name: ", name, "\nmodel:\n  builtin: {family: llama, vocab_size: 40, hidden_size: 24, ",
      "intermediate_size: 40, num_hidden_layers: 2, num_attention_heads: 4, seq: 8, seed: 4, ",
      keys, "}\nsplit: {stages: ", stages, "}\nschedule: {kind: ", schedule,
      ", microbatches: 4}\nplacement: {workers: 2}\ntraining:\n  batch_size: 8\n  steps: ", steps,
      "\n  loss: cross_entropy\n  optimizer: {kind: adamw, lr: 0.01}\n  checkpoint: {dir: ", ckpt,
      "}\ndata: {kind: synthetic, seed: 2}\n");
}

struct Generated {
  std::vector<std::vector<int64_t>> rows;
  std::string ran_on_job;
  int64_t weights_step = -1;
};

class LlamaGenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("OMP_NUM_THREADS", "1", 1);
    ClusterOptions options;
    options.workers = 2;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  // `stagectl -o json generate JOB --prompt-ids ...` greedily; the exit code and output.
  static CommandResult Run(const std::string& job,
                           const std::vector<std::vector<int64_t>>& prompts) {
    std::vector<std::string> argv = {"-o", "json", "generate", job};
    for (const auto& p : prompts) argv.insert(argv.end(), {"--prompt-ids", absl::StrJoin(p, " ")});
    argv.insert(argv.end(), {"--tokens", absl::StrCat(kNewTokens), "--temperature", "0"});
    return cluster_->Stagectl(argv);
  }

  static Generated Generate(const std::string& job,
                            const std::vector<std::vector<int64_t>>& prompts) {
    const CommandResult r = Run(job, prompts);
    Generated g;
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
    if (r.exit_code != 0) return g;
    const nlohmann::json json = nlohmann::json::parse(r.out);
    for (const nlohmann::json& row : json.at("rows")) {
      g.rows.push_back(row.at("tokens").get<std::vector<int64_t>>());
    }
    g.ran_on_job = json.at("ran_on_job").get<std::string>();
    g.weights_step = json.at("weights_step").get<int64_t>();
    return g;
  }

  // Submits `spec` and waits until `state` (or an end).
  static absl::StatusOr<v1::Job> SubmitAndWait(const std::string& spec, bool paused,
                                               v1::JobState state) {
    return cluster_->SubmitAndWait(spec, paused, state, absl::Seconds(180));
  }

  // The error of a Generate call on the coordinator (plaintext, as the test cluster's).
  static grpc::Status GenerateError(const v1::GenerateRequest& request);
  // Requests the coordinator and stagectl refuse before anything runs, naming the field.
  static void ExpectRefusals(const std::string& job);

  static LocalCluster* cluster_;
};

LocalCluster* LlamaGenerateTest::cluster_ = nullptr;

grpc::Status LlamaGenerateTest::GenerateError(const v1::GenerateRequest& request) {
  auto stub = v1::GenerationService::NewStub(grpc::CreateChannel(
      cluster_->coordinator_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&ctx, request);
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
  }
  return reader->Finish();
}

void LlamaGenerateTest::ExpectRefusals(const std::string& job) {
  v1::GenerateRequest both;
  both.set_job_id(job);
  both.set_tokens(4);
  both.add_prompt(1);
  both.add_prompts()->add_ids(2);
  grpc::Status status = GenerateError(both);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("prompt, prompts: give one of them, not both"));

  v1::GenerateRequest empty_row;
  empty_row.set_job_id(job);
  empty_row.set_tokens(4);
  empty_row.add_prompts()->add_ids(2);
  empty_row.add_prompts();
  status = GenerateError(empty_row);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("prompts[1]: needs at least one token"));

  v1::GenerateRequest too_many;
  too_many.set_job_id(job);
  too_many.set_tokens(4);
  for (int r = 0; r < 65; ++r) too_many.add_prompts()->add_ids(1);
  status = GenerateError(too_many);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("prompts: at most 64 rows, got 65"));

  CommandResult bad_ids =
      cluster_->Stagectl({"generate", job, "--prompt-ids", "1 two 3", "--tokens", "2"});
  EXPECT_EQ(bad_ids.exit_code, 2);
  EXPECT_THAT(bad_ids.err, HasSubstr("--prompt-ids: 'two' is not a token id"));
  CommandResult no_tokenizer =
      cluster_->Stagectl({"generate", job, "--prompt", "hello", "--tokens", "2"});
  EXPECT_EQ(no_tokenizer.exit_code, 2);
  EXPECT_THAT(no_tokenizer.err, HasSubstr("--prompt needs a tokenizer"));
}

TEST_F(LlamaGenerateTest, CachedGreedyOfRaggedPromptsEqualsTheReferencePastMaxPositions) {
  const std::string ckpt = cluster_->dir() + "/ckpt-llama";
  constexpr int64_t kSteps = 6;
  constexpr int64_t kMaxPositions = 48;
  auto done = SubmitAndWait(
      Spec("llama-gen",
           absl::StrCat("num_key_value_heads: 2, max_position_embeddings: ", kMaxPositions,
                        ", rope_theta: 500.0, rope_scaling: {rope_type: llama3, factor: 8.0, "
                        "low_freq_factor: 1.0, high_freq_factor: 4.0, "
                        "original_max_position_embeddings: 16}"),
           "ZBVZeroBubble", 4, kSteps, ckpt),
      false, v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << cluster_->Logs();

  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3, 4, 5}, {9, 8}, {30, 31, 32}};
  const Generated got = Generate(done->id(), prompts);
  ASSERT_EQ(got.rows.size(), prompts.size());
  LlamaReferenceConfig ref = Sizes();
  ref.kv_heads = 2;
  ref.theta = 500.0;
  ref.llama3 = LlamaReferenceConfig::Llama3{8.0, 1.0, 4.0, 16};
  const auto params = LoadAllStageFiles(ckpt, kSteps, 4);
  for (size_t r = 0; r < prompts.size(); ++r) {
    EXPECT_EQ(got.rows[r], GreedyLlamaReference(ref, params, prompts[r], kNewTokens, kMaxPositions))
        << "prompt " << r;
  }
  EXPECT_EQ(got.weights_step, kSteps);
  auto helper = cluster_->WaitForJob(got.ran_on_job, IsFinal, absl::Seconds(30));
  ASSERT_TRUE(helper.ok()) << helper.status();
  EXPECT_EQ(helper->state(), v1::JOB_STATE_CANCELLED);

  // A token the vocabulary lacks is refused before anything runs.
  const CommandResult outside = Run(done->id(), {{1, 40}});
  EXPECT_EQ(outside.exit_code, 1);
  EXPECT_THAT(outside.err, HasSubstr("prompt: token 1 is 40, outside the model's vocabulary"));
  ExpectRefusals(done->id());
}

TEST_F(LlamaGenerateTest, APausedQwen3DecodesItsCurrentWeightsAndTrainsOnAfterwards) {
  const std::string ckpt = cluster_->dir() + "/ckpt-qwen3";
  auto held = SubmitAndWait(
      Spec("qwen3-gen",
           "model_type: qwen3, num_key_value_heads: 2, head_dim: 6, max_position_embeddings: 128, "
           "tie_word_embeddings: true",
           "1F1B", 2, 3, ckpt),
      true, v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason();
  const std::string id = held->id();
  CommandResult checkpoint = cluster_->Stagectl({"checkpoint", id});
  ASSERT_EQ(checkpoint.exit_code, 0) << checkpoint.out << checkpoint.err;
  auto saved = cluster_->WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.checkpoints_size() > 0; },
      absl::Seconds(60));
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->checkpoints_size(), 1);

  const std::vector<std::vector<int64_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6}, {7}};
  const Generated got = Generate(id, prompts);
  ASSERT_EQ(got.rows.size(), prompts.size());
  LlamaReferenceConfig ref = Sizes();
  ref.kv_heads = 2;
  ref.qk_norm = true;
  ref.tied = true;
  const auto params = LoadAllStageFiles(ckpt, 0, 2);
  for (size_t r = 0; r < prompts.size(); ++r) {
    EXPECT_EQ(got.rows[r], GreedyLlamaReference(ref, params, prompts[r], kNewTokens, 128))
        << "prompt " << r;
  }
  EXPECT_EQ(got.ran_on_job, id);
  EXPECT_EQ(got.weights_step, 0);

  // The job trains on from where it was.
  CommandResult resume = cluster_->Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.out << resume.err;
  auto finished = cluster_->WaitForJob(id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->state(), v1::JOB_STATE_SUCCEEDED) << finished->reason();
  EXPECT_EQ(finished->global_steps_done(), 3);
}

}  // namespace
}  // namespace stagecoach::testing::llama_generate_test
