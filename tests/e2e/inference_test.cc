// Forward-only inference end to end: `stagectl infer` sends a .npy batch to a real coordinator,
// which plans the spec as a ForwardOnly job on real workers; the last stage's merged outputs
// come back and equal a single-process forward of the same model (tests/support/reference_mlp.h)
// within rtol 1e-5 + atol 1e-6, for 2 and 4 stages and uneven microbatches. Also: inputs of the
// wrong width fail naming the stage and microbatch, bad .npy files and too many microbatches
// are refused before anything runs, and the jobs are listed like any other. A built-in GPT takes
// int64 token ids and gives logits [B, T, vocab] that agree across placements and reproduce a
// training job's first loss.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/npy_files.h"
#include "tests/support/reference_mlp.h"

namespace stagecoach::testing::inference_test {
namespace {

using ::testing::HasSubstr;

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr uint64_t kSeed = 7;

std::string MlpSpec(const std::string& name, const std::vector<int64_t>& sizes, int stages,
                    int microbatches, const std::string& extra = "") {
  return absl::StrCat("name: ", name, "\n",  //
                      "model:\n  builtin: {family: mlp, sizes: [", absl::StrJoin(sizes, ", "),
                      "], seed: ", kSeed, "}\n",          //
                      "split: {stages: ", stages, "}\n",  //
                      "schedule: {kind: 1F1B, microbatches: ", microbatches, "}\n", extra);
}

class InferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.workers = 4;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    // A failed job's workers return to idle in the background.
    ASSERT_TRUE(cluster_->WaitForIdleWorkers(4, absl::Seconds(30)).ok()) << cluster_->Logs();
  }

  // Runs `stagectl infer` on `inputs` and returns the outputs it wrote, checking the job.
  torch::Tensor Infer(const std::string& spec_yaml, const torch::Tensor& inputs,
                      const std::string& name) {
    const std::string spec = cluster_->WriteFile(name + ".yaml", spec_yaml);
    const std::string in = cluster_->dir() + "/" + name + "-in.npy";
    const std::string out = cluster_->dir() + "/" + name + "-out.npy";
    WriteNpy(in, inputs);
    const absl::Time start = absl::Now();
    CommandResult r = cluster_->Stagectl({"infer", spec, "--input", in, "--out", out});
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
    std::cerr << name << ": " << inputs.sizes() << " in " << absl::FormatDuration(took) << " ("
              << r.err.substr(0, r.err.find('\n')) << ")\n";
    auto job = cluster_->GetJob(LastLine(r.out));
    EXPECT_TRUE(job.ok()) << job.status() << r.out;
    if (job.ok()) {
      EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
      EXPECT_EQ(job->schedule(), "ForwardOnly");
      EXPECT_EQ(job->steps_done(), 1);
      EXPECT_TRUE(job->losses().empty());
      for (const v1::RankStatus& rank : job->ranks()) {
        EXPECT_THAT(rank.executed_actions(), ::testing::ElementsAreArray(rank.assigned_actions()));
        for (const std::string& a : rank.executed_actions()) {
          EXPECT_EQ(a.find('B'), std::string::npos) << "backward in a forward-only job: " << a;
        }
      }
    }
    return ReadNpy(out);
  }

  static LocalCluster* cluster_;
};

LocalCluster* InferenceTest::cluster_ = nullptr;

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want) {
  ASSERT_EQ(got.sizes(), want.sizes());
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(got, want, kRtol, kAtol)) << "differs by up to " << diff;
  std::cerr << "largest |output - reference| " << diff << "\n";
}

TEST_F(InferenceTest, TwoStagesMatchTheReferenceWhateverTheSpecsTrainingSays) {
  const std::vector<int64_t> sizes = {16, 32, 32, 8};
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({10, 16});
  // Training keys (batch size, steps, checkpoints, data) do not apply to inference.
  const std::string spec = MlpSpec(
      "infer-two", sizes, 2, 4,
      absl::StrCat("training: {batch_size: 64, steps: 100, checkpoint: {dir: ", cluster_->dir(),
                   "/ckpt}}\ndata: {kind: synthetic, seed: 3}\n"));
  ExpectClose(Infer(spec, x, "two"), ReferenceForward(sizes, kSeed, x));
}

TEST_F(InferenceTest, FourStagesWithUnevenMicrobatchesMatchTheReference) {
  const std::vector<int64_t> sizes = {16, 24, 24, 24, 24, 6};
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({10, 16});  // 4 microbatches of 3, 3, 2, 2 rows
  ExpectClose(Infer(MlpSpec("infer-four", sizes, 4, 4), x, "four"),
              ReferenceForward(sizes, kSeed, x));
}

TEST_F(InferenceTest, ABatchOfSeveralMebibytesRoundTrips) {
  const std::vector<int64_t> sizes = {512, 256, 512};
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({4096, 512});  // 8 MiB in, 8 MiB out
  ExpectClose(Infer(MlpSpec("infer-large", sizes, 2, 8), x, "large"),
              ReferenceForward(sizes, kSeed, x));
}

TEST_F(InferenceTest, JsonOutputHasTheShapeAndValues) {
  const std::vector<int64_t> sizes = {4, 8, 3};
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({5, 4});
  const std::string spec = cluster_->WriteFile("json.yaml", MlpSpec("infer-json", sizes, 2, 2));
  const std::string in = cluster_->dir() + "/json-in.npy";
  WriteNpy(in, x);
  CommandResult r = cluster_->Stagectl({"infer", spec, "--input", in, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_EQ(j["shape"], nlohmann::json({5, 3}));
  const torch::Tensor want = ReferenceForward(sizes, kSeed, x);
  for (int i = 0; i < 5; ++i) {
    for (int k = 0; k < 3; ++k) {
      const double w = want[i][k].item<double>();
      EXPECT_NEAR(j["values"][i][k].get<double>(), w, kAtol + kRtol * std::abs(w));
    }
  }
  CommandResult table = cluster_->Stagectl({"infer", spec, "--input", in});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("outputs: float32[5, 3]"));
  EXPECT_THAT(table.out, HasSubstr("first values: "));
}

TEST_F(InferenceTest, InputsOfTheWrongWidthFailNamingTheStageAndMicrobatch) {
  const std::string spec =
      cluster_->WriteFile("wide.yaml", MlpSpec("infer-wide", {16, 32, 32, 8}, 2, 2));
  const std::string in = cluster_->dir() + "/wide-in.npy";
  WriteNpy(in, torch::randn({6, 12}));
  CommandResult r = cluster_->Stagectl({"infer", spec, "--input", in});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("failed"));
  EXPECT_THAT(r.err, HasSubstr("stage 0"));
  EXPECT_THAT(r.err, HasSubstr("microbatch"));
  std::cerr << "wrong width: " << r.err;
}

TEST_F(InferenceTest, BadInputsAreRefusedBeforeAnythingRuns) {
  const std::string spec =
      cluster_->WriteFile("bad.yaml", MlpSpec("infer-bad", {16, 32, 32, 8}, 2, 4));
  CommandResult before = cluster_->Stagectl({"list", "-o", "json"});
  ASSERT_EQ(before.exit_code, 0) << before.err;

  const std::string big_endian = cluster_->dir() + "/big-endian.npy";
  WriteNpy(big_endian, torch::randn({6, 16}), ">f4");
  CommandResult r = cluster_->Stagectl({"infer", spec, "--input", big_endian});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(big_endian + ": dtype '>f4' is big-endian"));

  const std::string text = cluster_->WriteFile("not.npy", "1,2,3\n");
  r = cluster_->Stagectl({"infer", spec, "--input", text});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(text + ": not a NumPy .npy file"));

  r = cluster_->Stagectl({"infer", spec, "--input", cluster_->dir() + "/missing.npy"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("missing.npy: cannot read the file"));

  // Fewer rows than microbatches.
  const std::string three_rows = cluster_->dir() + "/three-rows.npy";
  WriteNpy(three_rows, torch::randn({3, 16}));
  r = cluster_->Stagectl({"infer", spec, "--input", three_rows});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("schedule.microbatches: must be <= the rows of inputs"));

  r = cluster_->Stagectl({"infer", spec, "--input", three_rows, "--timeout", "soon"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--timeout"));

  CommandResult after = cluster_->Stagectl({"list", "-o", "json"});
  ASSERT_EQ(after.exit_code, 0) << after.err;
  EXPECT_EQ(nlohmann::json::parse(after.out).size(), nlohmann::json::parse(before.out).size())
      << "a refused inference queued a job";
}

TEST_F(InferenceTest, InferenceJobsAreListedLikeAnyOther) {
  const std::string spec =
      cluster_->WriteFile("listed.yaml", MlpSpec("infer-listed", {8, 8, 8}, 2, 2));
  const std::string in = cluster_->dir() + "/listed-in.npy";
  WriteNpy(in, torch::randn({4, 8}));
  CommandResult r =
      cluster_->Stagectl({"infer", spec, "--input", in, "--out", cluster_->dir() + "/o.npy"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string job_id = LastLine(r.out);
  CommandResult list = cluster_->Stagectl({"list", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  bool found = false;
  for (const auto& job : nlohmann::json::parse(list.out)) {
    if (job["id"] != job_id) continue;
    found = true;
    EXPECT_EQ(job["name"], "infer-listed");
    EXPECT_EQ(job["state"], "SUCCEEDED");
    EXPECT_EQ(job["schedule"], "ForwardOnly");
    EXPECT_EQ(job["steps_done"], 1);
    EXPECT_EQ(job["max_bubble_ratios"].size(), 1u);
  }
  EXPECT_TRUE(found) << job_id << " not in " << list.out;
  CommandResult table = cluster_->Stagectl({"list"});
  EXPECT_THAT(table.out, HasSubstr(job_id));
}

// 6000 little-endian uint16 tokens below `vocab`: a few random phrases in random order.
std::vector<int64_t> GptTokens(int vocab) {
  std::mt19937 rng(4242);
  std::vector<std::vector<int64_t>> phrases(5);
  for (auto& p : phrases) {
    for (int i = 0; i < 7; ++i) p.push_back(static_cast<int64_t>(rng() % vocab));
  }
  std::vector<int64_t> tokens;
  while (tokens.size() < 6000) {
    for (int64_t t : phrases[rng() % phrases.size()]) tokens.push_back(t);
  }
  return tokens;
}

std::string GptSpec(const std::string& name, int stages, int workers, const std::string& kind,
                    int microbatches, const std::string& data) {
  return absl::StrCat("name: ", name, "\n",  //
                      "model:\n  builtin: {family: gpt, vocab: 64, d_model: 32, layers: 2, "
                      "heads: 4, seq: 16, seed: 21}\n",   //
                      "split: {stages: ", stages, "}\n",  //
                      "schedule: {kind: ", kind, ", microbatches: ", microbatches, "}\n",
                      "placement: {workers: ", workers, "}\n",
                      "training:\n  batch_size: 8\n  steps: 1\n  loss: cross_entropy\n"
                      "  optimizer: {kind: adamw, lr: 1.0e-3}\n",
                      "data: {kind: tokens, path: ", data, ", seed: 13}\n");
}

// A built-in GPT forward-only: token ids (int64 .npy) in, logits [B, T, vocab] out, finite, the
// same for 2 stages on 2 workers (1F1B) and 4 stages on 4 workers (GPipe), and the model a
// training job trains: the cross-entropy of the logits on that job's first batch (rebuilt here
// from worker/runtime/data/training_data.h's definition of data.kind tokens), mean over the
// job's microbatches, is the job's first loss.
TEST_F(InferenceTest, GptLogitsHaveTheirShapeAgreeAcrossPlacementsAndAreTheTrainedModels) {
  constexpr int kVocab = 64, kSeq = 16, kBatch = 8, kMicrobatches = 4;
  const std::vector<int64_t> tokens = GptTokens(kVocab);
  std::string bytes;
  for (int64_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  const std::string data = cluster_->WriteFile("gpt-tokens.bin", bytes);

  // Step 0's batch: starts = randint(0, N - T, [B], generator(seed + 1)).
  at::Generator gen = at::detail::createCPUGenerator(13 + 1);
  const torch::Tensor starts =
      torch::randint(0, static_cast<int64_t>(tokens.size()) - kSeq, {kBatch}, gen, torch::kInt64);
  const torch::Tensor all = torch::tensor(tokens, torch::kInt64);
  std::vector<torch::Tensor> xs, ys;
  for (int b = 0; b < kBatch; ++b) {
    const int64_t s = starts[b].item<int64_t>();
    xs.push_back(all.slice(0, s, s + kSeq));
    ys.push_back(all.slice(0, s + 1, s + kSeq + 1));
  }
  const torch::Tensor x = torch::stack(xs), y = torch::stack(ys);

  const std::string train = cluster_->WriteFile(
      "gpt-train.yaml", GptSpec("gpt-train-one", 2, 2, "1F1B", kMicrobatches, data));
  CommandResult submit = cluster_->Stagectl({"submit", train, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << cluster_->Logs();
  auto trained = cluster_->GetJob(LastLine(submit.out));
  ASSERT_TRUE(trained.ok()) << trained.status();
  ASSERT_EQ(trained->losses_size(), 1);
  ASSERT_TRUE(cluster_->WaitForIdleWorkers(4, absl::Seconds(30)).ok()) << cluster_->Logs();

  std::vector<torch::Tensor> outputs;
  for (const auto& [name, stages, kind] : std::vector<std::tuple<std::string, int, std::string>>{
           {"gpt-two", 2, "1F1B"}, {"gpt-four", 4, "GPipe"}}) {
    SCOPED_TRACE(name);
    const std::string spec = GptSpec(name, stages, stages, kind, kMicrobatches, data);
    const std::string in = cluster_->dir() + "/" + name + "-in.npy";
    const std::string out = cluster_->dir() + "/" + name + "-out.npy";
    WriteNpy(in, x, "<i8");
    CommandResult r = cluster_->Stagectl(
        {"infer", cluster_->WriteFile(name + ".yaml", spec), "--input", in, "--out", out});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
    const torch::Tensor logits = ReadNpy(out);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{kBatch, kSeq, kVocab}));
    EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
    EXPECT_GT(logits.std().item<double>(), 0.0) << "constant logits";
    outputs.push_back(logits);
  }
  ASSERT_EQ(outputs.size(), 2u);
  ExpectClose(outputs[1], outputs[0]);

  // The training job's first loss from the inferred logits.
  const auto logit_mbs = torch::tensor_split(outputs[0], kMicrobatches, 0);
  const auto target_mbs = torch::tensor_split(y, kMicrobatches, 0);
  double sum = 0;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    sum += torch::nn::functional::cross_entropy(logit_mbs[mb].reshape({-1, kVocab}),
                                                target_mbs[mb].reshape({-1}))
               .item<double>();
  }
  const double want = trained->losses(0), got = sum / kMicrobatches;
  EXPECT_NEAR(got, want, kAtol + kRtol * std::abs(want));
}

}  // namespace
}  // namespace stagecoach::testing::inference_test
