// A pipeline of CUDA stages across worker processes, exchanging activations over Gloo through
// host memory (one GPU cannot hold two NCCL ranks): every step's loss and every stage's final
// parameters equal the single-process CPU reference. Skipped where no CUDA device is visible.
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <map>

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

namespace stagecoach::testing::gpu_pipeline_test {
namespace {

constexpr int64_t kSteps = 3;

struct Case {
  std::string schedule;
  int stages;
};

class GpuPipelineTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuPipelineTest, CudaStagesOverGlooMatchTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to LibTorch";
  const Case& c = GetParam();
  ReferenceConfig ref_config;
  ref_config.sizes = {32, 64, 64, 64, 64, 8};
  ref_config.model_seed = 5;
  ref_config.data_seed = 6;
  ref_config.batch_size = 48;
  ref_config.microbatches = 4;
  ref_config.steps = kSteps;
  ref_config.loss = "mse";
  ref_config.optimizer = "adamw";
  ref_config.lr = 0.01;
  ref_config.weight_decay = 0.01;

  ClusterOptions options;
  options.workers = 2;
  options.worker_args = {"--device", "cuda:0"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string ckpt = (*cluster)->dir() + "/ckpt";
  const std::string spec = (*cluster)->WriteFile(
      "spec.yaml",
      absl::StrCat("name: gpu\nmodel:\n  builtin: {family: mlp, sizes: [",
                   absl::StrJoin(ref_config.sizes, ", "), "], seed: 5}\n", "split: {stages: ",
                   c.stages, "}\n", "schedule: {kind: ", c.schedule, ", microbatches: 4}\n",
                   "placement: {workers: 2, device: cuda, transport: gloo}\n",
                   "training:\n  batch_size: 48\n  steps: ", kSteps,
                   "\n  loss: mse\n  optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}\n",
                   "  checkpoint: {dir: ", ckpt, "}\n", "data: {kind: synthetic, seed: 6}\n"));
  CommandResult submit = (*cluster)->Stagectl({"submit", spec, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << (*cluster)->Logs();
  auto job = (*cluster)->GetJob(LastLine(submit.out));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();

  const ReferenceResult ref = TrainReference(ref_config);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(job->losses(step), ref.losses[step], 1e-6 + 1e-5 * std::abs(ref.losses[step]));
  }
  size_t checked = 0;
  for (int s = 0; s < c.stages; ++s) {
    for (const auto& [name, got] : LoadStageFile(StageFilePath(ckpt, kSteps, s))) {
      EXPECT_TRUE(got.is_cpu()) << "stage files hold CPU tensors";
      EXPECT_TRUE(torch::allclose(got, ref.params.at(name), 1e-5, 1e-6)) << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, ref.params.size());
  for (const v1::RankStatus& rank : job->ranks()) {
    EXPECT_THAT(rank.executed_actions(), ::testing::ElementsAreArray(rank.assigned_actions()));
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, GpuPipelineTest,
                         ::testing::Values(Case{"1F1B", 2}, Case{"ZBVZeroBubble", 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.schedule == "1F1B" ? std::string("OneFOneB")
                                                                : info.param.schedule;
                         });

}  // namespace
}  // namespace stagecoach::testing::gpu_pipeline_test
