// The numerical contract across real processes: a coordinator and one worker per stage on
// loopback train an MLP through GPipe and 1F1B pipelines, and every step's loss and every
// stage's final parameters equal a single-process reference (tests/support/reference_mlp.h)
// within rtol 1e-5 + atol 1e-6. The data plane is real: each rank's sent and received bytes are
// exactly the activations and gradients of its stage boundaries, and each rank executed exactly
// the action list it was assigned.
#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/stage_files.h"

namespace stagecoach::testing::pipeline_training_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 10;

struct Case {
  std::string name;
  int stages;
  std::string schedule;
  int microbatches;
  ReferenceConfig ref;
};

std::string SpecYaml(const Case& c, const std::string& ckpt_dir) {
  return MlpSpecYaml(c.ref, {c.name, c.schedule, c.stages, c.stages, c.microbatches}, ckpt_dir);
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class PipelineTrainingTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineTrainingTest, MatchesUnpipelinedReference) {
  const Case& c = GetParam();
  ClusterOptions options;
  options.workers = c.stages;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string ckpt = (*cluster)->dir() + "/ckpt";
  const std::string spec = (*cluster)->WriteFile("spec.yaml", SpecYaml(c, ckpt));

  CommandResult submit = (*cluster)->Stagectl({"submit", spec, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << (*cluster)->Logs();
  const std::string job_id = LastLine(submit.out);
  ASSERT_FALSE(job_id.empty()) << submit.out;
  auto job = (*cluster)->GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();

  const ReferenceResult ref = TrainReference(c.ref);

  // Every step's loss.
  ASSERT_EQ(job->losses_size(), kSteps);
  double max_loss_diff = 0;
  for (int step = 0; step < kSteps; ++step) {
    max_loss_diff = std::max(max_loss_diff, std::abs(job->losses(step) - ref.losses[step]));
    EXPECT_NEAR(job->losses(step), ref.losses[step], kAtol + kRtol * std::abs(ref.losses[step]))
        << "step " << step;
  }

  // Every stage's final parameters; together the stages hold every parameter exactly once.
  std::vector<StageLayers> layers;
  const double max_param_diff = ExpectParamsMatchReference(
      LoadAllStageFiles(ckpt, kSteps, c.stages, &layers), ref, kRtol, kAtol);

  std::cerr << c.name << ": largest |loss - reference| " << max_loss_diff
            << ", largest |parameter - reference| " << max_param_diff << "\n";

  // The data plane moved exactly the activations and gradients of each rank's boundaries, and
  // each rank ran exactly its assigned actions.
  ASSERT_EQ(job->ranks_size(), c.stages);
  for (const v1::RankStatus& rank : job->ranks()) {
    const int s = rank.stages(0);
    int64_t widths = 0;
    if (s > 0) widths += c.ref.sizes[layers[s].first];
    if (s + 1 < c.stages) widths += c.ref.sizes[layers[s].last + 1];
    const int64_t expected = kSteps * c.ref.batch_size * widths * 4;
    EXPECT_EQ(rank.bytes_sent(), expected) << "rank " << rank.rank();
    EXPECT_EQ(rank.bytes_received(), expected) << "rank " << rank.rank();
    EXPECT_GT(rank.bytes_sent(), 0);
    EXPECT_EQ(rank.steps_done(), kSteps);
    EXPECT_THAT(rank.executed_actions(), ::testing::ElementsAreArray(rank.assigned_actions()))
        << "rank " << rank.rank();
  }
}

ReferenceConfig Ref(std::vector<int64_t> sizes, int64_t batch, int microbatches, std::string loss,
                    std::string optimizer, double lr, double momentum, double weight_decay) {
  return MlpReference(std::move(sizes), 11, 4242, batch, microbatches, kSteps, std::move(loss),
                      std::move(optimizer), lr, momentum, weight_decay);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineTrainingTest,
    ::testing::Values(
        Case{"two-stages-gpipe", 2, "GPipe", 4,
             Ref({16, 32, 32, 8}, 32, 4, "mse", "sgd", 0.05, 0.9, 0.0)},
        // 30 rows in 4 microbatches: 8, 8, 7, 7 (tensor_split).
        Case{"two-stages-1f1b", 2, "1F1B", 4,
             Ref({16, 32, 32, 32, 5}, 30, 4, "cross_entropy", "adamw", 0.01, 0.0, 0.01)},
        Case{"four-stages-gpipe", 4, "GPipe", 8,
             Ref({16, 24, 24, 24, 24, 24, 6}, 40, 8, "cross_entropy", "sgd", 0.1, 0.0, 0.001)},
        Case{"four-stages-1f1b", 4, "1F1B", 6,
             Ref({16, 32, 32, 32, 32, 8}, 27, 6, "mse", "adamw", 0.005, 0.0, 0.01)}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.name;
      name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
      return name;
    });

}  // namespace
}  // namespace stagecoach::testing::pipeline_training_test
