// The demo's job (scripts/demo_gpt.sh: a character GPT of 8 blocks on two workers under
// ZBVZeroBubble, 4 stages, 8 microbatches, the split left to its default) on worker processes:
// the coordinator profiles the model and balances the two ranks, and in the steps that follow
// every rank's measured bubble is within 0.1 of what the schedule simulator gives the same
// step's measured action costs (GetJob's balance), as medians over the steps sampled; rank 0,
// which a split by stages left idle, is busy. Synthetic tokens stand in for the demo's fortunes
// text (they change nothing a step computes); the test checks that the demo script still runs
// this model and schedule.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::testing::demo_balance_test {
namespace {

using ::testing::HasSubstr;

// The demo's model and schedule lines, as scripts/demo_gpt.sh writes them (its vocabulary is
// the fortunes text's characters, about 100).
constexpr char kModel[] =
    "builtin: {family: gpt, vocab: $VOCAB, d_model: 128, layers: 8, heads: 4, seq: 64, seed: 1,";
constexpr char kSchedule[] = "schedule: {kind: ZBVZeroBubble, microbatches: 8}";
constexpr int kSteps = 40;

std::string DemoSpec() {
  return absl::StrCat(
      "name: demo-balance\nmodel:\n  builtin: {family: gpt, vocab: 100, d_model: 128, layers: 8, "
      "heads: 4, seq: 64, seed: 1,\n            tie_embeddings: true}\n",
      "split: {stages: 4}\n", kSchedule, "\nplacement: {workers: 2}\n",
      "training:\n  batch_size: 32\n  steps: ", kSteps,
      "\n  loss: cross_entropy\n  optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.01}\n"
      "  lr_schedule: {kind: cosine, warmup_steps: 10, min_lr: 0.0003}\n"
      "  grad_clip: {max_norm: 1.0}\n",
      "data: {kind: synthetic, seed: 1}\n");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

TEST(DemoBalance, TheDemosRanksBubbleAsTheScheduleSaysForTheirMeasuredCosts) {
  std::ifstream script(std::string(STAGECOACH_CONFIGS_DIR) + "/../scripts/demo_gpt.sh");
  std::stringstream text;
  text << script.rdbuf();
  ASSERT_THAT(text.str(), HasSubstr(kModel)) << "the demo's model changed: update this test";
  ASSERT_THAT(text.str(), HasSubstr(kSchedule)) << "the demo's schedule changed: update this test";

  ClusterOptions options;
  options.workers = 2;
  options.log_level = "info";
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForIdleWorkers(2, absl::Seconds(30)).ok());
  auto id = (*cluster)->Submit(DemoSpec());
  ASSERT_TRUE(id.ok()) << id.status();

  // Every traced step after the warm-up, sampled while the job runs and once it has ended.
  std::map<int64_t, v1::Job> sampled;
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  v1::Job job;
  while (absl::Now() < deadline) {
    auto got = (*cluster)->GetJob(*id);
    ASSERT_TRUE(got.ok()) << got.status();
    job = *got;
    if (job.balance_step() >= 5) sampled.emplace(job.balance_step(), job);
    if (IsFinal(job)) break;
    absl::SleepFor(absl::Milliseconds(150));
  }
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << (*cluster)->Logs();
  EXPECT_THAT(job.split(), HasSubstr("profiled (default"));
  ASSERT_GE(sampled.size(), 5u) << "too few steps traced";
  ASSERT_EQ(job.balance_size(), 2);

  for (int r = 0; r < 2; ++r) {
    std::vector<double> measured, simulated;
    for (const auto& [step, j] : sampled) {
      measured.push_back(j.balance(r).measured_bubble_ratio());
      simulated.push_back(j.balance(r).simulated_bubble_ratio());
    }
    const double m = Median(measured), s = Median(simulated);
    std::cerr << absl::StrFormat(
        "rank %d (stages %d,%d): measured bubble %.3f, simulated for its measured costs %.3f "
        "(medians of %d steps); predicted by the plan %.3f\n",
        r, job.balance(r).stages(0), job.balance(r).stages(1), m, s,
        static_cast<int>(sampled.size()), job.balance(r).predicted_bubble_ratio());
    EXPECT_NEAR(m, s, 0.1) << "rank " << r;
    // Neither rank idles most of the step, as rank 0 did under a split by stages.
    EXPECT_LT(m, 0.5) << "rank " << r;
  }
}

}  // namespace
}  // namespace stagecoach::testing::demo_balance_test
