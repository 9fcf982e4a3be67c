// The numerical contract for every schedule across real processes: for each schedule kind, a
// coordinator and four workers on loopback train an MLP with 2 and 4 workers, 1 and 2 stages per
// worker where the schedule allows it, with SGD and with AdamW, for 3 steps. Every step's loss
// and every stage's final parameters equal a single-process reference without a pipeline
// (tests/support/reference_mlp.h, which shares no code with the worker) within rtol 1e-5 +
// atol 1e-6; every rank executed exactly its assigned list; the data plane moved exactly the
// activations and gradients of the boundaries between ranks (in-memory handovers move nothing).
#include <torch/serialize.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/schedule/build.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/stage_files.h"

namespace stagecoach::testing::schedule_matrix_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 3;
// Nine layers: enough for 4 workers x 2 stages.
const std::vector<int64_t> kSizes = {10, 16, 16, 16, 16, 16, 16, 16, 16, 4};

struct Variant {
  int workers;
  int stages_per_worker;
  std::string optimizer;  // sgd | adamw
  int microbatches;
  int64_t batch;
  std::string name;
};

ReferenceConfig Reference(const Variant& v) {
  ReferenceConfig r;
  r.sizes = kSizes;
  r.model_seed = 21;
  r.data_seed = 909;
  r.batch_size = v.batch;
  r.microbatches = v.microbatches;
  r.steps = kSteps;
  r.loss = "cross_entropy";
  r.optimizer = v.optimizer;
  r.lr = v.optimizer == "sgd" ? 0.2 : 0.01;
  r.momentum = v.optimizer == "sgd" ? 0.5 : 0.0;
  r.weight_decay = 0.01;
  return r;
}

std::string SpecYaml(const std::string& kind, const Variant& v, const std::string& ckpt_dir) {
  return MlpSpecYaml(Reference(v),
                     {v.name, kind, v.workers * v.stages_per_worker, v.workers, v.microbatches},
                     ckpt_dir);
}

// The variants `kind` accepts: 2 and 4 workers, 1 and 2 stages per worker, SGD and AdamW.
std::vector<Variant> Variants(schedule::ScheduleKind kind) {
  std::vector<Variant> out;
  for (int workers : {2, 4}) {
    for (int spw : {1, 2}) {
      // Uneven microbatches: 30 rows in 4 (8, 8, 7, 7), 36 rows in 8 (5 x4, 4 x4).
      const int m = workers == 2 ? 4 : 8;
      const int64_t batch = workers == 2 ? 30 : 36;
      if (!schedule::BuildSchedule({kind, workers, spw, m}).ok()) continue;
      for (const std::string optimizer : {"sgd", "adamw"}) {
        out.push_back(Variant{workers, spw, optimizer, m, batch,
                              absl::StrCat("w", workers, "-s", spw, "-", optimizer)});
      }
    }
  }
  return out;
}

// Checks one finished job against the reference.
void CheckJob(const v1::Job& job, const Variant& v, const std::string& ckpt) {
  SCOPED_TRACE(v.name);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const ReferenceResult ref = TrainReference(Reference(v));
  ASSERT_EQ(job.losses_size(), kSteps);
  // Every step reported a measured bubble ratio (the workers timed every action).
  ASSERT_EQ(job.max_bubble_ratios_size(), kSteps);
  for (double ratio : job.max_bubble_ratios()) {
    EXPECT_GT(ratio, 0.0);  // some rank always waits at the pipeline's ends
    EXPECT_LT(ratio, 1.0);
  }
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(job.losses(step), ref.losses[step], kAtol + kRtol * std::abs(ref.losses[step]))
        << "step " << step;
  }

  const int stages = v.workers * v.stages_per_worker;
  std::vector<StageLayers> layers;
  ExpectParamsMatchReference(LoadAllStageFiles(ckpt, kSteps, stages, &layers), ref, kRtol, kAtol);

  // Which rank holds each stage, from the job's rank table.
  std::vector<int> rank_of(stages, -1);
  for (const v1::RankStatus& rank : job.ranks()) {
    for (int s : rank.stages()) rank_of[s] = rank.rank();
  }
  ASSERT_EQ(job.ranks_size(), v.workers);
  for (const v1::RankStatus& rank : job.ranks()) {
    // Bytes cross only boundaries between ranks: each one carries an activation forward and a
    // gradient back, the width of the layer input at the boundary, every row, every step.
    int64_t widths = 0;
    for (int s : rank.stages()) {
      if (s > 0 && rank_of[s - 1] != rank.rank()) widths += kSizes[layers[s].first];
      if (s + 1 < stages && rank_of[s + 1] != rank.rank()) widths += kSizes[layers[s].last + 1];
    }
    const int64_t expected = kSteps * v.batch * widths * 4;
    EXPECT_EQ(rank.bytes_sent(), expected) << "rank " << rank.rank();
    EXPECT_EQ(rank.bytes_received(), expected) << "rank " << rank.rank();
    EXPECT_EQ(rank.steps_done(), kSteps);
    EXPECT_THAT(rank.executed_actions(), ::testing::ElementsAreArray(rank.assigned_actions()))
        << "rank " << rank.rank();
  }
}

class ScheduleMatrixTest : public ::testing::TestWithParam<schedule::ScheduleKind> {};

TEST_P(ScheduleMatrixTest, EveryVariantMatchesTheReference) {
  const schedule::ScheduleKind kind = GetParam();
  const std::string kind_name(schedule::ScheduleKindName(kind));
  const std::vector<Variant> variants = Variants(kind);
  ASSERT_FALSE(variants.empty()) << kind_name << " accepts none of the variants";

  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // Submit every variant at once; the coordinator's gang queue runs them as workers free up.
  std::vector<std::string> job_ids, ckpts;
  for (const Variant& v : variants) {
    const std::string ckpt = absl::StrCat((*cluster)->dir(), "/ckpt-", v.name);
    const std::string spec =
        (*cluster)->WriteFile(absl::StrCat(v.name, ".yaml"), SpecYaml(kind_name, v, ckpt));
    CommandResult submit = (*cluster)->Stagectl({"submit", spec});
    ASSERT_EQ(submit.exit_code, 0) << v.name << ": " << submit.out << submit.err;
    job_ids.push_back(LastLine(submit.out));
    ASSERT_FALSE(job_ids.back().empty()) << submit.out;
    ckpts.push_back(ckpt);
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    auto job = (*cluster)->WaitForJob(job_ids[i], IsFinal, absl::Seconds(180));
    ASSERT_TRUE(job.ok()) << variants[i].name << ": " << job.status() << (*cluster)->Logs();
    CheckJob(*job, variants[i], ckpts[i]);
    if (HasFailure()) std::cerr << (*cluster)->Logs();
  }
  std::cerr << kind_name << ": " << variants.size() << " variants checked\n";
}

INSTANTIATE_TEST_SUITE_P(
    AllSchedules, ScheduleMatrixTest,
    ::testing::Values(schedule::ScheduleKind::kGPipe, schedule::ScheduleKind::k1F1B,
                      schedule::ScheduleKind::kInterleaved1F1B, schedule::ScheduleKind::kLoopedBFS,
                      schedule::ScheduleKind::kInterleavedZeroBubble,
                      schedule::ScheduleKind::kZBVZeroBubble, schedule::ScheduleKind::kDualPipeV,
                      schedule::ScheduleKind::kVHalf, schedule::ScheduleKind::kVMin),
    [](const ::testing::TestParamInfo<schedule::ScheduleKind>& info) {
      std::string name(schedule::ScheduleKindName(info.param));
      return name == "1F1B" ? std::string("OneFOneB") : name;
    });

}  // namespace
}  // namespace stagecoach::testing::schedule_matrix_test
