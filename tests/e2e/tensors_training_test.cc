// data.kind tensors across real processes: Python writes a dataset with torch.save({"inputs": X,
// "targets": Y}) from a fixed seed, N not a multiple of batch_size so the steps wrap around, and
// a coordinator and workers on loopback train an MLP on it (2 stages with GPipe and mse, 4 stages
// with 1F1B and cross_entropy). Every step's loss and every stage's final parameters equal the
// single-process reference (tests/support/reference_mlp.h) trained on the same file, read there
// with its own reader, within rtol 1e-5 + atol 1e-6. A job on a bad file fails naming data.path.
#include <torch/torch.h>

#include <cstdlib>
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
#include "tests/support/python.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/stage_files.h"

namespace stagecoach::testing::tensors_training_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 5;

// argv: path, rows, in, out, loss, seed. Inputs float64 (the worker reads them as float32),
// targets from a random teacher: class indices for cross_entropy, tanh for mse.
constexpr char kWriter[] = R"PY(
import sys, torch
path, loss = sys.argv[1], sys.argv[5]
n, d_in, d_out, seed = (int(a) for a in sys.argv[2:5] + sys.argv[6:7])
g = torch.Generator().manual_seed(seed)
X = torch.randn(n, d_in, generator=g, dtype=torch.float64)
W = torch.randn(d_in, d_out, generator=g, dtype=torch.float64)
Y = (X @ W).argmax(1) if loss == "cross_entropy" else torch.tanh(X @ W).float()
torch.save({"inputs": X, "targets": Y}, path)
)PY";

struct Case {
  std::string name;
  int stages;
  std::string schedule;
  int microbatches;
  int64_t rows;  // N in the file
  ReferenceConfig ref;
};

std::string SpecYaml(const Case& c, const std::string& data, const std::string& ckpt_dir) {
  return MlpSpecYaml(c.ref, {c.name, c.schedule, c.stages, c.stages, c.microbatches}, ckpt_dir,
                     absl::StrCat("{kind: tensors, path: ", data, "}"));
}

ReferenceConfig Ref(std::vector<int64_t> sizes, int64_t batch, int microbatches, std::string loss,
                    std::string optimizer, double lr, double momentum, double weight_decay) {
  return MlpReference(std::move(sizes), 31, 0, batch, microbatches, kSteps, std::move(loss),
                      std::move(optimizer), lr, momentum, weight_decay);
}

const std::vector<Case>& Cases() {
  static const auto* cases = new std::vector<Case>{
      // 23 rows, 10 per step: steps start at rows 0, 10, 20 (20-22, 0-6), 7, 17 (17-22, 0-3).
      {"two-stages-gpipe-mse", 2, "GPipe", 4, 23,
       Ref({8, 16, 16, 3}, 10, 4, "mse", "sgd", 0.1, 0.5, 0.0)},
      // 29 rows, 12 per step in 4 microbatches of 3.
      {"four-stages-1f1b-ce", 4, "1F1B", 4, 29,
       Ref({8, 16, 16, 16, 5}, 12, 4, "cross_entropy", "adamw", 0.01, 0.0, 0.01)},
  };
  return *cases;
}

void CheckJob(const v1::Job& job, const Case& c, const ReferenceConfig& ref_config,
              const std::string& ckpt) {
  SCOPED_TRACE(c.name);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const ReferenceResult ref = TrainReference(ref_config);
  ASSERT_EQ(job.losses_size(), kSteps);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(job.losses(step), ref.losses[step], kAtol + kRtol * std::abs(ref.losses[step]))
        << "step " << step;
  }
  ExpectParamsMatchReference(LoadAllStageFiles(ckpt, kSteps, c.stages), ref, kRtol, kAtol);
  for (const v1::RankStatus& rank : job.ranks()) EXPECT_EQ(rank.steps_done(), kSteps);
}

TEST(TensorsData, PipelinesMatchTheReferenceOnAPythonFile) {
  if (!PythonHasTorch()) GTEST_SKIP() << kPython << " cannot import torch";
  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string script = (*cluster)->WriteFile("write.py", kWriter);

  std::vector<std::string> job_ids, ckpts, data_paths;
  for (const Case& c : Cases()) {
    const std::string data = absl::StrCat((*cluster)->dir(), "/", c.name, ".pt");
    ASSERT_EQ(std::system(absl::StrCat(kPython, " '", script, "' '", data, "' ", c.rows, " ",
                                       c.ref.sizes.front(), " ", c.ref.sizes.back(), " ",
                                       c.ref.loss, " ", 1000 + c.stages)
                              .c_str()),
              0);
    const std::string ckpt = absl::StrCat((*cluster)->dir(), "/ckpt-", c.name);
    const std::string spec =
        (*cluster)->WriteFile(absl::StrCat(c.name, ".yaml"), SpecYaml(c, data, ckpt));
    CommandResult submit = (*cluster)->Stagectl({"submit", spec});
    ASSERT_EQ(submit.exit_code, 0) << c.name << ": " << submit.out << submit.err;
    job_ids.push_back(LastLine(submit.out));
    ASSERT_FALSE(job_ids.back().empty()) << submit.out;
    ckpts.push_back(ckpt);
    data_paths.push_back(data);
  }
  for (size_t i = 0; i < Cases().size(); ++i) {
    const Case& c = Cases()[i];
    auto job = (*cluster)->WaitForJob(job_ids[i], IsFinal, absl::Seconds(180));
    ASSERT_TRUE(job.ok()) << c.name << ": " << job.status() << (*cluster)->Logs();
    ReferenceConfig ref = c.ref;
    const ReferenceDataset dataset = LoadReferenceDataset(data_paths[i]);
    ASSERT_TRUE(dataset.inputs.defined() && dataset.targets.defined());
    ASSERT_EQ(dataset.inputs.size(0), c.rows);
    ref.dataset_inputs = dataset.inputs;
    ref.dataset_targets = dataset.targets;
    CheckJob(*job, c, ref, ckpts[i]);
    if (HasFailure()) std::cerr << (*cluster)->Logs();
  }
}

TEST(TensorsData, AJobOnABadFileFailsNamingDataPath) {
  ClusterOptions options;
  options.workers = 2;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string data = (*cluster)->WriteFile("bad.pt", "not a torch.save file\n");
  const Case& c = Cases()[0];
  const std::string spec = (*cluster)->WriteFile(
      "bad.yaml", SpecYaml(c, data, absl::StrCat((*cluster)->dir(), "/ckpt")));
  CommandResult submit = (*cluster)->Stagectl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const std::string job_id = LastLine(submit.out);
  ASSERT_FALSE(job_id.empty()) << submit.out;
  auto job = (*cluster)->WaitForJob(job_id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(job.ok()) << job.status() << (*cluster)->Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->reason(), ::testing::HasSubstr(absl::StrCat("data.path: '", data, "'")));
}

}  // namespace
}  // namespace stagecoach::testing::tensors_training_test
