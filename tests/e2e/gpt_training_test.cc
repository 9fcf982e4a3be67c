// A built-in GPT learns a tokens file across worker processes: a coordinator and four workers on
// loopback train a small decoder on a repetitive synthetic "language" (a few random sentences
// repeated in random order) with 1F1B over 4 stages and with ZBVZeroBubble over 2 workers x 2
// stages. Each job succeeds and its loss falls clearly: the mean of the last 10 steps is below
// 0.8x the mean of the first 10 and below ln(vocab) (a uniform guess). Both schedules train the
// same model on the same batches, so their step losses agree (the numerical contract).
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/token_files.h"

namespace stagecoach::testing::gpt_training_test {
namespace {

constexpr int kVocab = 64;
constexpr int kSteps = 50;

// 20k tokens: 8 random sentences of 6 to 12 tokens, picked at random.
std::string TokenFile() { return PhraseTokenFile(12345, kVocab, 8, 6, 7, 20000); }

std::string SpecYaml(const std::string& name, const std::string& kind, int workers, int stages,
                     const std::string& data_path) {
  return absl::StrCat(
      "name: ", name, "\n", "model:\n  builtin: {family: gpt, vocab: ", kVocab,
      ", d_model: 32, layers: 4, heads: 4, seq: 16, seed: 3}\n", "split: {stages: ", stages, "}\n",
      "schedule: {kind: ", kind, ", microbatches: 8}\n", "placement: {workers: ", workers, "}\n",
      "training:\n  batch_size: 16\n  steps: ", kSteps,
      "\n  loss: cross_entropy\n  optimizer: {kind: adamw, lr: 3.0e-3, weight_decay: 0.01}\n",
      "data: {kind: tokens, path: ", data_path, ", seed: 5}\n");
}

double Mean(const v1::Job& job, int from, int to) {
  double sum = 0;
  for (int i = from; i < to; ++i) sum += job.losses(i);
  return sum / (to - from);
}

TEST(GptTraining, LossFallsOnATokensFileUnderEverySchedule) {
  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string data = (*cluster)->WriteFile("train.bin", TokenFile());

  struct Run {
    std::string name, kind;
    int workers, stages;
  };
  const std::vector<Run> runs = {{"gpt-1f1b", "1F1B", 4, 4}, {"gpt-zbv", "ZBVZeroBubble", 2, 4}};
  std::vector<std::string> job_ids;
  std::vector<std::vector<double>> losses;
  for (const Run& run : runs) {
    const std::string spec =
        (*cluster)->WriteFile(absl::StrCat(run.name, ".yaml"),
                              SpecYaml(run.name, run.kind, run.workers, run.stages, data));
    CommandResult submit = (*cluster)->Stagectl({"submit", spec});
    ASSERT_EQ(submit.exit_code, 0) << run.name << ": " << submit.out << submit.err;
    job_ids.push_back(LastLine(submit.out));
    ASSERT_FALSE(job_ids.back().empty()) << submit.out;
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(runs[i].name);
    auto job = (*cluster)->WaitForJob(job_ids[i], IsFinal, absl::Seconds(120));
    ASSERT_TRUE(job.ok()) << job.status() << (*cluster)->Logs();
    ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << (*cluster)->Logs();
    ASSERT_EQ(job->losses_size(), kSteps);
    const double first = Mean(*job, 0, 10);
    const double last = Mean(*job, kSteps - 10, kSteps);
    std::cerr.precision(8);
    std::cerr << runs[i].name << ": mean loss of steps 0-9 " << first << ", of steps "
              << kSteps - 10 << "-" << kSteps - 1 << " " << last << ", final "
              << job->losses(kSteps - 1) << "\n";
    EXPECT_LT(last, 0.8 * first);
    EXPECT_LT(job->losses(kSteps - 1), std::log(static_cast<double>(kVocab)));
    EXPECT_LT(last, std::log(static_cast<double>(kVocab)));
    losses.emplace_back(job->losses().begin(), job->losses().end());
  }
  ASSERT_EQ(losses.size(), 2u);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(losses[1][step], losses[0][step], 1e-6 + 1e-4 * std::abs(losses[0][step]))
        << "step " << step;
  }
}

}  // namespace
}  // namespace stagecoach::testing::gpt_training_test
