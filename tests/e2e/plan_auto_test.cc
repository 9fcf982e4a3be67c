// The plan search across real processes: a coordinator and four CPU workers on loopback.
// `stagectl plan` profiles an MLP on a worker (I and W timed, sizes measured) and ranks every
// schedule x stages per worker x microbatches x split; a limit between the leanest and the
// fastest plan's peak makes it lead with a plan that fits and holds less; a limit nothing meets
// is refused naming the smallest peak. A `schedule.kind: auto` job runs the plan the search
// chose (status shows it and the runner-up) and trains to the numbers of a single-process
// reference with the chosen microbatch count; one with an impossible placement.memory_limit is
// refused at submit.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/stage_files.h"

namespace stagecoach::testing::plan_auto_test {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSteps = 4;

ReferenceConfig Config(int microbatches) {
  return MlpReference({32, 64, 64, 64, 64, 64, 64, 64, 8}, 21, 8, 64, microbatches, kSteps, "mse",
                      "sgd", 1.0, 0.0, 0.0);
}

std::string AutoSpec(const std::string& ckpt, const std::string& placement_extra = "") {
  const ReferenceConfig c = Config(1);
  return absl::StrCat(
      "name: auto-mlp\n", "model:\n  builtin: {family: mlp, sizes: [32, 64, 64, ",
      "64, 64, 64, 64, 64, 8], seed: ", c.model_seed, "}\n", "schedule: {kind: auto}\n",
      "placement: {workers: 4", placement_extra, "}\n", "training:\n  batch_size: ", c.batch_size,
      "\n  steps: ", kSteps, "\n  loss: mse\n  optimizer: ", OptimizerYaml(c),
      "\n  checkpoint: {dir: ", ckpt, "}\n", "data: {kind: synthetic, seed: ", c.data_seed, "}\n");
}

nlohmann::json PlanJson(LocalCluster& cluster, const std::vector<std::string>& args) {
  CommandResult r = cluster.Stagectl(args, absl::Seconds(240));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cluster.Logs();
  return nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
}

TEST(PlanAutoTest, PlanRanksAndAnAutoJobRunsTheChoiceToTheReference) {
  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string ckpt = (*cluster)->dir() + "/ckpt";
  const std::string spec = (*cluster)->WriteFile("auto.yaml", AutoSpec(ckpt));

  // The ranked search, as JSON: fastest first, all fit without a limit, the profile complete.
  const nlohmann::json plans = PlanJson(**cluster, {"plan", spec, "-o", "json"});
  ASSERT_TRUE(plans.is_object()) << plans;
  const nlohmann::json& candidates = plans["candidates"];
  ASSERT_GT(candidates.size(), 20u);
  int64_t leanest = candidates[0]["max_peak_bytes"].get<int64_t>();
  for (size_t i = 0; i < candidates.size(); ++i) {
    EXPECT_TRUE(candidates[i]["fits"].get<bool>());
    if (i > 0) {
      EXPECT_LE(candidates[i - 1]["step_seconds"].get<double>(),
                candidates[i]["step_seconds"].get<double>());
    }
    leanest = std::min(leanest, candidates[i]["max_peak_bytes"].get<int64_t>());
  }
  ASSERT_EQ(plans["layers"].size(), 8u);
  for (const nlohmann::json& layer : plans["layers"]) {
    EXPECT_GT(layer["forward_seconds"].get<double>(), 0) << layer;
    EXPECT_GT(layer["backward_weight_seconds"].get<double>(), 0) << layer;
    EXPECT_GT(layer["activation_bytes"].get<int64_t>(), 0) << layer;
  }
  const int64_t fastest_peak = candidates[0]["max_peak_bytes"].get<int64_t>();
  std::cout << "fastest: " << candidates[0].dump() << "\nleanest peak " << leanest << "\n";

  // The table.
  CommandResult table = (*cluster)->Stagectl({"plan", spec, "--top", "5"}, absl::Seconds(240));
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("plans searched"));
  EXPECT_THAT(table.out, HasSubstr("STAGES/W"));
  std::cout << table.out;

  // A limit between the leanest and the fastest plan's peak.
  if (leanest < fastest_peak) {
    const int64_t limit = leanest + (fastest_peak - leanest) / 4;
    const nlohmann::json tight =
        PlanJson(**cluster, {"plan", spec, "--memory-limit", absl::StrCat(limit), "-o", "json"});
    ASSERT_FALSE(tight["candidates"].empty());
    const nlohmann::json& chosen = tight["candidates"][0];
    EXPECT_TRUE(chosen["fits"].get<bool>()) << chosen;
    EXPECT_LE(chosen["max_peak_bytes"].get<int64_t>(), limit);
    EXPECT_EQ(tight["memory_limit_bytes"].get<int64_t>(), limit);
  }

  // Nothing fits 1 KiB.
  CommandResult none =
      (*cluster)->Stagectl({"plan", spec, "--memory-limit", "1KiB"}, absl::Seconds(240));
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_THAT(none.err, HasSubstr("no plan fits 1.0 KiB per worker"));

  // kind: auto at submit, with an impossible limit: refused, naming the smallest peak.
  const std::string tiny =
      (*cluster)->WriteFile("tiny.yaml", AutoSpec(ckpt, ", memory_limit: 1KiB"));
  CommandResult refused = (*cluster)->Stagectl({"submit", tiny}, absl::Seconds(240));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("placement.memory_limit: no plan fits 1.0 KiB per worker: "
                                     "the smallest predicted peak of the"));

  // kind: auto: the chosen plan runs and trains to the reference.
  CommandResult submit = (*cluster)->Stagectl({"submit", spec, "--wait"}, absl::Seconds(300));
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << (*cluster)->Logs();
  const std::string id = LastLine(submit.out);
  auto job = (*cluster)->GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
  ASSERT_TRUE(job->has_plan_choice());
  const v1::PlanCandidate& chosen = job->plan_choice().chosen();
  EXPECT_EQ(job->schedule(), chosen.schedule());
  EXPECT_EQ(job->microbatches(), chosen.microbatches());
  EXPECT_EQ(job->num_stages(), chosen.num_stages());
  EXPECT_TRUE(job->plan_choice().has_runner_up());
  EXPECT_GT(job->plan_choice().candidates(), 20);
  ASSERT_EQ(job->memory_size(), 4);
  std::cout << "auto job ran " << chosen.schedule() << " with " << chosen.microbatches()
            << " microbatches, split " << chosen.split_policy() << "\n";

  const ReferenceResult ref = TrainReference(Config(chosen.microbatches()));
  ASSERT_EQ(job->losses_size(), kSteps);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(job->losses(step), ref.losses[step], 1e-6 + 1e-5 * std::abs(ref.losses[step]))
        << "step " << step;
  }
  ExpectParamsMatchReference(LoadAllStageFiles(ckpt, kSteps, chosen.num_stages()), ref, 1e-5, 1e-6);

  CommandResult status = (*cluster)->Stagectl({"status", id});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("Plan:      chosen by a search of"));
  EXPECT_THAT(status.out, HasSubstr("Runner-up: "));
  CommandResult json = (*cluster)->Stagectl({"status", id, "-o", "json"});
  EXPECT_THAT(json.out, HasSubstr("\"plan_choice\""));
}

}  // namespace
}  // namespace stagecoach::testing::plan_auto_test
