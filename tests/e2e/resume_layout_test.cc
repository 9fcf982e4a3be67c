// A checkpoint resumed onto another layout (coordinator/checkpoints/resume_layout.h,
// worker/runtime/checkpoint/checkpoint_by_name.h), across real processes: a built-in GPT with
// AdamW and a tokens file, trained 6 steps straight on 2 stages (1F1B), against the same 6 steps
// in three jobs, each resuming the last one's checkpoint on another layout:
//   1. 2 stages, 1F1B, 2 workers (as the straight run);
//   2. 6 stages, ZBVZeroBubble (2 stages per rank), 3 workers per replica, 2 replicas, the
//      optimizer state sharded (ZeRO-1);
//   3. 1 stage on 1 worker, GPipe.
// Every job splits the global batch into the same 8 microbatches (2 replicas x 4 in job 2), so
// the per-step losses equal the straight run's within the numerical contract (rtol 1e-5). With
// tied embeddings: 2 stages -> 1 stage -> 6 stages Interleaved1F1B on 2 workers -> 3 stages on
// 2 replicas.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/token_files.h"

namespace stagecoach::testing::resume_layout_test {
namespace {

constexpr int kVocab = 48;
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

struct Layout {
  std::string schedule;
  int stages;
  int workers;
  int replicas;
  bool shard;
};

std::string Spec(const std::string& name, const Layout& l, int steps, const std::string& data,
                 const std::string& ckpt, const std::string& resume_from, bool tied) {
  std::string training = absl::StrCat(
      "training:\n  batch_size: 16\n  steps: ", steps,
      "\n  loss: cross_entropy\n  optimizer: {kind: adamw, lr: 3.0e-3, weight_decay: 0.01}\n");
  if (!ckpt.empty()) absl::StrAppend(&training, "  checkpoint: {dir: ", ckpt, "}\n");
  if (!resume_from.empty()) absl::StrAppend(&training, "  resume_from: ", resume_from, "\n");
  return absl::StrCat("name: ", name, "\n", "model:\n  builtin: {family: gpt, vocab: ", kVocab,
                      ", d_model: 32, layers: 3, heads: 4, seq: 12, seed: 5, tie_embeddings: ",
                      tied ? "true" : "false", "}\n", "split: {stages: ", l.stages, "}\n",
                      "schedule: {kind: ", l.schedule, ", microbatches: ", 8 / l.replicas, "}\n",
                      "placement: {workers: ", l.workers, ", replicas: ", l.replicas,
                      ", shard_optimizer: ", l.shard ? "true" : "false", "}\n", training,
                      "data: {kind: tokens, path: ", data, ", seed: 3}\n");
}

class ResumeLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }

  // Runs the job to its end; its losses (the steps it ran).
  std::vector<double> Run(LocalCluster& c, const std::string& name, const std::string& spec) {
    CommandResult submit = c.Stagectl({"submit", c.WriteFile(name + ".yaml", spec), "--wait"});
    EXPECT_EQ(submit.exit_code, 0) << submit.out << submit.err << c.Logs();
    auto job = c.GetJob(LastLine(submit.out));
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << name << ": " << job->reason() << c.Logs();
    return std::vector<double>(job->losses().begin(), job->losses().end());
  }

  // 6 steps straight on `straight_layout`, then 2 steps on each of `legs`, each resuming the
  // last one's checkpoint: the same losses.
  void ExpectTheStraightRun(const Layout& straight_layout, const std::vector<Layout>& legs,
                            bool tied) {
    ClusterOptions options;
    options.workers = 6;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    LocalCluster& c = **cluster;
    const std::string data = c.WriteFile("train.bin", PhraseTokenFile(41, kVocab, 6, 4, 8, 5000));
    const std::vector<double> straight =
        Run(c, "straight", Spec("straight", straight_layout, 2 * legs.size(), data, "", "", tied));
    ASSERT_EQ(straight.size(), 2 * legs.size());
    std::vector<double> losses;
    std::string resume_from;
    for (size_t i = 0; i < legs.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("leg ", i));
      const std::string ckpt = absl::StrCat(c.dir(), "/ckpt-", i);
      const std::string name = absl::StrCat("leg-", i);
      std::vector<double> leg = Run(c, name, Spec(name, legs[i], 2, data, ckpt, resume_from, tied));
      ASSERT_GE(leg.size(), 2u);
      // A resumed job's losses are its timeline's last steps.
      losses.insert(losses.end(), leg.end() - 2, leg.end());
      resume_from = checkpoint::CheckpointStepDirectory(ckpt, 2 * static_cast<int64_t>(i + 1));
    }
    ASSERT_EQ(losses.size(), straight.size());
    for (size_t step = 0; step < losses.size(); ++step) {
      EXPECT_NEAR(losses[step], straight[step], kAtol + kRtol * std::abs(straight[step]))
          << "step " << step;
    }
    if (HasFailure()) std::cerr << c.Logs();
  }
};

TEST_F(ResumeLayout, TwoStagesOntoSixShardedOnTwoReplicasAndOntoOneGiveTheStraightRun) {
  const Layout two{"1F1B", 2, 2, 1, false};
  ExpectTheStraightRun(two, {two, {"ZBVZeroBubble", 6, 3, 2, true}, {"GPipe", 1, 1, 1, false}},
                       false);
}

// Tied embeddings (which ZeRO-1 does not take): the last stage's copy of the embedding comes
// from the checkpoint stage that holds the embedding, on every layout.
TEST_F(ResumeLayout, TiedEmbeddingsFollowTheirCopyAcrossLayouts) {
  const Layout two{"1F1B", 2, 2, 1, false};
  ExpectTheStraightRun(two,
                       {two,
                        {"GPipe", 1, 1, 1, false},
                        {"Interleaved1F1B", 6, 2, 1, false},
                        {"1F1B", 3, 3, 2, false}},
                       true);
}

}  // namespace
}  // namespace stagecoach::testing::resume_layout_test
