// Tied embeddings (model.builtin.tie_embeddings) across real processes: a built-in GPT whose
// head is its token embedding trains on 4 stages, with the two ends on different ranks (1F1B on
// 4 workers: their gradients cross between ranks 0 and 3) and on one rank (ZBVZeroBubble on 2
// workers: stages 0 and 3 both on rank 0), with global clipping. Every step's loss and gradient
// norm (the tied weight counted once) and every final parameter equal the tied unpipelined GPT
// of tests/support/reference_gpt.h, trained from the job's own step-0 export, within rtol 1e-5 +
// atol 1e-6. The checkpoint holds the tied weight once (the last stage's files have no
// head.weight), and a job resumed after step 3, whose last stage restores its copy from stage
// 0's file, repeats the straight run's step 4 bit for bit: the copies were bit-identical. SGD with
// momentum, not AdamW: the attention's key bias has a gradient that is zero in exact arithmetic
// (softmax ignores a constant added to every key) and rounding noise in practice, which AdamW
// divides by its own root mean square into steps of 1e-6 that differ between any two correct
// implementations.
#include <torch/serialize.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_gpt.h"
#include "tests/support/stage_files.h"
#include "tests/support/step_zero.h"

namespace stagecoach::testing::tied_embeddings_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 4;

struct Case {
  std::string name;
  std::string schedule;
  int workers;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The job: kSteps steps with a checkpoint after step 3; with `resume_from`, the steps after it.
std::string Spec(const Case& c, const std::string& ckpt, const std::string& resume_from = "") {
  return absl::StrCat(
      "name: ", c.name, resume_from.empty() ? "" : "-resumed", "\n",
      "model:\n  builtin: {family: gpt, vocab: 32, d_model: 16, layers: 2, heads: 2, seq: 8, "
      "seed: 4, tie_embeddings: true}\n",
      "split: {stages: 4}\n", "schedule: {kind: ", c.schedule, ", microbatches: 4}\n",
      "placement: {workers: ", c.workers, "}\n",
      "training:\n  batch_size: 8\n  steps: ", resume_from.empty() ? kSteps : kSteps - 3,
      "\n  loss: cross_entropy\n", "  optimizer: {kind: sgd, lr: 0.1, momentum: 0.9}\n",
      "  grad_clip: {max_norm: 0.5}\n", "  checkpoint: {dir: ", ckpt, ", every_steps: 3}\n",
      resume_from.empty() ? "" : absl::StrCat("  resume_from: ", resume_from, "\n"),
      "data: {kind: synthetic, seed: 9}\n");
}

// Whether a training-state file (stage-<s>.pt: {"state_dict": {...}, ...}) has parameter `name`.
bool StateHasParameter(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  EXPECT_FALSE(bytes.empty()) << "cannot read " << path;
  if (bytes.empty()) return false;
  for (const auto& entry : torch::pickle_load(bytes).toGenericDict()) {
    if (entry.key().toStringRef() != "state_dict") continue;
    for (const auto& p : entry.value().toGenericDict()) {
      if (p.key().toStringRef() == name) return true;
    }
  }
  return false;
}

// The spec's GPT, tied, unpipelined, from `initial`.
GptReferenceConfig TiedReference(const std::map<std::string, torch::Tensor>& initial) {
  GptReferenceConfig ref;
  ref.vocab = 32;
  ref.d_model = 16;
  ref.layers = 2;
  ref.heads = 2;
  ref.seq = 8;
  ref.tied = true;
  ref.data_seed = 9;
  ref.batch_size = 8;
  ref.microbatches = 4;
  ref.steps = kSteps;
  ref.optimizer = "sgd";
  ref.lr = 0.1;
  ref.momentum = 0.9;
  ref.max_norm = 0.5;
  ref.initial = initial;
  return ref;
}

class TiedEmbeddings : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { setenv("OMP_NUM_THREADS", "1", 1); }
};

TEST_P(TiedEmbeddings, TrainLikeTheTiedUnpipelinedGptAndTheCopiesStayEqual) {
  const Case& c = GetParam();
  ClusterOptions options;
  options.workers = c.workers;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& cl = **cluster;
  const std::string ckpt = cl.dir() + "/ckpt";
  const std::string spec = cl.WriteFile("spec.yaml", Spec(c, ckpt));

  v1::Job done_job;
  ASSERT_NO_FATAL_FAILURE(RunFromAStepZeroCheckpoint(cl, spec, &done_job));
  const v1::Job* done = &done_job;

  // The exports hold the tied weight once: stage 0 has it, the last stage's has no head.weight.
  const std::map<std::string, torch::Tensor> initial = LoadAllStageFiles(ckpt, 0, 4);
  ASSERT_EQ(initial.count("embed.tok.weight"), 1u);
  EXPECT_EQ(initial.count("head.weight"), 0u);
  EXPECT_EQ(LoadStageFile(StageFilePath(ckpt, 0, 3)).count("head.weight"), 0u);

  const GptReferenceResult want = TrainGptReference(TiedReference(initial));

  ASSERT_EQ(done->losses_size(), kSteps);
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_NEAR(done->losses(k), want.losses[k], kAtol + kRtol * std::abs(want.losses[k]))
        << "step " << k;
  }
  // The norm counted the tied weight once (the last step's, as the job reports it).
  ASSERT_TRUE(done->has_grad_norm());
  EXPECT_NEAR(done->grad_norm(), want.grad_norms.back(),
              kAtol + kRtol * want.grad_norms.back());
  const std::map<std::string, torch::Tensor> final_params = LoadAllStageFiles(ckpt, kSteps, 4);
  ASSERT_EQ(final_params.size(), want.params.size());
  double largest = 0;
  for (const auto& [name, p] : want.params) {
    ASSERT_EQ(final_params.count(name), 1u) << name;
    const double diff = (final_params.at(name) - p).abs().max().item<double>();
    largest = std::max(largest, diff);
    EXPECT_TRUE(torch::allclose(final_params.at(name), p, kRtol, kAtol)) << name << " by " << diff;
  }
  // The checkpoint holds the weight once: the last stage's training-state file has no copy.
  const std::string dir = absl::StrFormat("%s/step-%06d", ckpt, kSteps);
  EXPECT_TRUE(StateHasParameter(dir + "/stage-0.pt", "embed.tok.weight"));
  EXPECT_FALSE(StateHasParameter(dir + "/stage-3.pt", "head.weight"));
  EXPECT_FALSE(torch::equal(final_params.at("embed.tok.weight"), initial.at("embed.tok.weight")))
      << "it did not train";

  // Resumed after step 3, the last stage's copy comes from stage 0's file. The resumed step
  // equals the straight run's bit for bit only if the two copies were bit-identical there.
  const std::string ckpt2 = cl.dir() + "/ckpt-resumed";
  CommandResult resumed = cl.Stagectl(
      {"submit", cl.WriteFile("resumed.yaml", Spec(c, ckpt2, absl::StrFormat("%s/step-%06d", ckpt, 3))),
       "--wait"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err << cl.Logs();
  auto again = cl.GetJob(LastLine(resumed.out));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->losses_size(), 1);
  EXPECT_EQ(again->losses(0), done->losses(3));
  const std::map<std::string, torch::Tensor> resumed_params = LoadAllStageFiles(ckpt2, kSteps, 4);
  ASSERT_EQ(resumed_params.size(), final_params.size());
  for (const auto& [name, p] : final_params) {
    EXPECT_TRUE(torch::equal(resumed_params.at(name), p)) << name;
  }
  std::cerr << c.name << ": largest |parameter - reference| " << largest << "\n";
}

INSTANTIATE_TEST_SUITE_P(Placements, TiedEmbeddings,
                         ::testing::Values(Case{"tied-1f1b", "1F1B", 4},
                                           Case{"tied-zbv", "ZBVZeroBubble", 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.schedule;
                         });

}  // namespace
}  // namespace stagecoach::testing::tied_embeddings_test
