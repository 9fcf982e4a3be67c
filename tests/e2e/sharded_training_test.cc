// ZeRO's shard levels (placement.shard: none | optimizer | gradients | parameters) across real
// processes: a coordinator and 2 replicas x 2 workers train an MLP, 1F1B with one stage per rank
// and ZBVZeroBubble with two, SGD (momentum) and AdamW, and at every level every step's loss and
// every stage's final parameters equal the single-process reference (tests/support/
// reference_mlp.h) on the whole batch in replicas x microbatches microbatches, within rtol 1e-5 +
// atol 1e-6.
//
// What each rank holds between steps is measured by its worker's counting allocator (the
// allocations behind its stages' parameters and gradients and the optimizer's shards of them),
// per rank with N = its stages' parameters and c = ceil(N_s / D) summed over its stages s
// (each stage's shard, padded; D the replicas), in float32 bytes:
//                 parameters     gradients
//   none          4N             4N
//   optimizer     4N + 4c        4N + 4c
//   gradients     4N + 4c        4c
//   parameters    4c             4c
// Bytes sent per step by its data-parallel collectives (the ring: each replica sends D - 1 of
// the D shards of a reduce-scattered or all-gathered buffer; with 2 replicas its whole buffer in
// an all-reduce):
//   none 4N (all-reduce, D = 2); optimizer and gradients 4c(D-1) + 4c(D-1) (reduce-scatter,
//   all-gather after the optimizer step); parameters 4c(D-1) per stage for its reduce-scatter
//   plus 4c(D-1) for each UNSHARD of the stage in the rank's list (its all-gather; the
//   checkpoints' gathers are outside steps).
// A checkpoint resumes across shard levels (parameters -> none -> gradients gives the straight
// run's losses), and the replicas hold the same bits after every step (the coordinator compares
// their digests at each step's checkpoint). A `schedule.kind: auto` job with shard: auto under a
// memory limit no unsharded plan meets runs the sharded level its plan search chose.
#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/resumed_legs.h"
#include "tests/support/stage_files.h"

namespace stagecoach::testing::sharded_training_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 3;
constexpr int kReplicas = 2;
constexpr int kWorkers = 2;  // per replica
const char* const kLevels[] = {"none", "optimizer", "gradients", "parameters"};

struct Case {
  std::string name;
  std::string schedule;
  int stages;
  int microbatches;  // per replica
  ReferenceConfig ref;
  std::string unshard;  // placement.unshard with shard: parameters
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ReferenceConfig Ref(std::vector<int64_t> sizes, int64_t batch, int microbatches,
                    std::string optimizer, double lr, double momentum, double weight_decay) {
  return MlpReference(std::move(sizes), 7, 99, batch, microbatches, kSteps, "mse",
                      std::move(optimizer), lr, momentum, weight_decay);
}

std::string SpecYaml(const Case& c, const std::string& level, const std::string& ckpt,
                     const std::string& resume_from = "") {
  std::string spec = MlpSpecYaml(
      c.ref, {absl::StrCat(c.name, "-", level), c.schedule, c.stages, kWorkers, c.microbatches},
      ckpt);
  std::string placement = absl::StrCat("placement: {workers: ", kWorkers, ", replicas: ", kReplicas,
                                       ", shard: ", level);
  if (level == "parameters") absl::StrAppend(&placement, ", unshard: ", c.unshard);
  spec = absl::StrReplaceAll(
      spec, {{absl::StrCat("placement: {workers: ", kWorkers, "}"), placement + "}"},
             {absl::StrCat("checkpoint: {dir: ", ckpt, "}"),
              absl::StrCat("checkpoint: {dir: ", ckpt, ", every_steps: 1}")}});
  if (!resume_from.empty()) {
    spec = absl::StrReplaceAll(
        spec,
        {{"\n  checkpoint:", absl::StrCat("\n  resume_from: ", resume_from, "\n  checkpoint:")}});
  }
  return spec;
}

class ShardedTrainingTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }
};

// Per rank of the finished `job` at `level`: the held bytes and the bytes its collectives sent
// (the table above), and the replicas' equal digests.
void ExpectHeldAndSentBytes(const v1::Job& job, const std::string& level, const std::string& name,
                            int replicas = kReplicas) {
  // A ring reduce-scatter or all-gather of a padded buffer of `replicas` shards sends all but one.
  const auto shard_of = [replicas](int64_t n) { return (n + replicas - 1) / replicas; };
  const int64_t others = replicas - 1;
  std::map<int, int64_t> stage_params;
  for (const auto& st : job.stages()) stage_params[st.stage()] = st.parameters();
  for (const v1::RankStatus& rank : job.ranks()) {
    SCOPED_TRACE(absl::StrCat("replica ", rank.replica(), " rank ", rank.rank()));
    int64_t n = 0, shard = 0, sent = 0;
    for (int s : rank.stages()) {
      n += stage_params[s];
      shard += shard_of(stage_params[s]);
      int unshards = 0;
      for (const std::string& a : rank.assigned_actions()) {
        if (a == absl::StrCat(s, "UNSHARD")) ++unshards;
      }
      if (level == "none") {
        EXPECT_EQ(unshards, 0);
        ASSERT_EQ(replicas, 2) << "the all-reduce's bytes are written for 2 replicas";
        sent += 4 * stage_params[s];
      } else if (level == "parameters") {
        EXPECT_GE(unshards, 1);
        sent += 4 * others * shard_of(stage_params[s]) * (1 + unshards);
      } else {
        EXPECT_EQ(unshards, 0);
        sent += 8 * others * shard_of(stage_params[s]);
      }
    }
    int64_t want_params = 4 * n, want_grads = 4 * n;
    if (level == "optimizer") {
      want_params = want_grads = 4 * n + 4 * shard;
    } else if (level == "gradients") {
      want_params = 4 * n + 4 * shard;
      want_grads = 4 * shard;
    } else if (level == "parameters") {
      want_params = want_grads = 4 * shard;
    }
    EXPECT_EQ(rank.held_parameter_bytes(), want_params);
    EXPECT_EQ(rank.held_gradient_bytes(), want_grads);
    EXPECT_EQ(rank.reduction_bytes_sent(), kSteps * sent);
    EXPECT_GE(rank.gather_hidden_ratio(), 0.0);
    EXPECT_LE(rank.gather_hidden_ratio(), 1.0);
    std::cerr << name << " shard " << level << " replica " << rank.replica() << " rank "
              << rank.rank() << ": holds " << rank.held_parameter_bytes() << " B parameters, "
              << rank.held_gradient_bytes() << " B gradients; sent "
              << rank.reduction_bytes_sent() / kSteps << " B a step; all-gathers hidden "
              << rank.gather_hidden_ratio() << "\n";
    // Same bits on both replicas after the last step.
    const v1::RankStatus& replica_0 = job.ranks(rank.rank());
    for (int s : rank.stages()) {
      EXPECT_EQ(rank.parameter_digests().at(s), replica_0.parameter_digests().at(s)) << s;
    }
  }
}

// One job at `level`: the reference's losses and parameters, the held and sent bytes.
void RunLevel(LocalCluster& cluster, const Case& c, const std::string& level,
              const ReferenceResult& ref) {
  SCOPED_TRACE(level);
  const std::string ckpt = absl::StrCat(cluster.dir(), "/ckpt-", level);
  const std::string spec =
      cluster.WriteFile(absl::StrCat(level, ".yaml"), SpecYaml(c, level, ckpt));
  CommandResult submit = cluster.Stagectl({"submit", spec, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << cluster.Logs();
  auto job = cluster.GetJob(LastLine(submit.out));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << cluster.Logs();
  ASSERT_EQ(job->losses_size(), kSteps);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(job->losses(step), ref.losses[step], kAtol + kRtol * std::abs(ref.losses[step]))
        << "step " << step;
  }
  const double diff =
      ExpectParamsMatchReference(LoadAllStageFiles(ckpt, kSteps, c.stages), ref, kRtol, kAtol);
  std::cerr << c.name << " shard " << level << ": largest |parameter - reference| " << diff << "\n";

  ASSERT_EQ(job->ranks_size(), kReplicas * kWorkers);
  // stagectl status shows what the ranks measured.
  CommandResult status = cluster.Stagectl({"status", job->id(), "-o", "json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const nlohmann::json shown = nlohmann::json::parse(status.out, nullptr, false);
  ASSERT_TRUE(shown.is_object()) << status.out;
  ASSERT_EQ(shown.at("ranks").size(), static_cast<size_t>(job->ranks_size()));
  for (int i = 0; i < job->ranks_size(); ++i) {
    const nlohmann::json& r = shown.at("ranks").at(i);
    EXPECT_EQ(r.at("held_parameter_bytes").get<int64_t>(), job->ranks(i).held_parameter_bytes());
    EXPECT_EQ(r.at("held_gradient_bytes").get<int64_t>(), job->ranks(i).held_gradient_bytes());
    EXPECT_GT(r.at("peak_live_bytes").get<int64_t>(), job->ranks(i).held_parameter_bytes());
    EXPECT_EQ(r.at("gather_hidden_ratio").get<double>(), job->ranks(i).gather_hidden_ratio());
  }
  ExpectHeldAndSentBytes(*job, level, c.name);
}

TEST_P(ShardedTrainingTest, EveryLevelMatchesTheReferenceAndHoldsItsShare) {
  const Case& c = GetParam();
  ClusterOptions options;
  options.workers = kReplicas * kWorkers;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const ReferenceResult ref = TrainReference(c.ref);
  for (const char* level : kLevels) RunLevel(**cluster, c, level, ref);
}

TEST(ShardedCheckpoints, ResumeAcrossShardLevelsGivesTheStraightRun) {
  setenv("OMP_NUM_THREADS", "1", 1);
  ClusterOptions options;
  options.workers = kReplicas * kWorkers;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& cl = **cluster;
  Case c{"resume", "1F1B", 2, 2, Ref({16, 32, 31, 5}, 24, 4, "adamw", 0.01, 0.0, 0.01), "step"};
  ReferenceConfig straight = c.ref;
  straight.steps = 6;
  const ReferenceResult want = TrainReference(straight);
  c.ref.steps = 2;
  const std::vector<std::string> legs = {"parameters", "none", "gradients"};
  ResumedLegs run;
  RunResumedLegs(
      cl, "resume", 3, 2,
      [&](int i, const std::string& ckpt, const std::string& resume_from) {
        return SpecYaml(c, legs[i], ckpt, resume_from);
      },
      &run);
  if (::testing::Test::HasFatalFailure()) return;
  ExpectLossesNear(run.losses, want.losses, kRtol, kAtol);
  ExpectParamsMatchReference(LoadAllStageFiles(run.last_checkpoint_dir, 6, 2), want, kRtol, kAtol);
}

// placement.shard: auto end to end: under a placement.memory_limit just below the leanest peak
// `stagectl plan` predicts without sharding, the search of a `schedule.kind: auto` job keeps a
// sharded level, and the job runs it: the reference's losses and parameters, that level's held
// and sent bytes.
TEST(ShardedPlanSearch, AnAutoJobUnderALimitNoUnshardedPlanMeetsRunsTheLevelTheSearchChose) {
  setenv("OMP_NUM_THREADS", "1", 1);
  // 4 replicas of one worker: with 2, sharding a single stage saves nothing at the step's peak
  // (its gathered parameters and whole gradients are live together in the backward).
  constexpr int kAutoReplicas = 4;
  ClusterOptions options;
  options.workers = kAutoReplicas;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& cl = **cluster;
  const std::string ckpt = cl.dir() + "/ckpt-auto";
  ReferenceConfig ref = Ref({16, 128, 128, 127, 8}, 32, 1, "adamw", 0.01, 0.0, 0.01);
  auto spec_with = [&](const std::string& limit) {
    return absl::StrCat(
        "name: auto-shard\nmodel:\n  builtin: {family: mlp, sizes: [",
        absl::StrJoin(ref.sizes, ", "), "], seed: ", ref.model_seed,
        "}\nschedule: {kind: auto}\nplacement: {workers: 1, replicas: ", kAutoReplicas,
        ", shard: auto", limit.empty() ? "" : absl::StrCat(", memory_limit: ", limit),
        "}\ntraining:\n  batch_size: ", ref.batch_size, "\n  steps: ", kSteps,
        "\n  loss: mse\n  optimizer: ", OptimizerYaml(ref), "\n  checkpoint: {dir: ", ckpt,
        ", every_steps: 1}\n", "data: {kind: synthetic, seed: ", ref.data_seed, "}\n");
  };
  auto plan = [&](const std::vector<std::string>& args) {
    CommandResult r = cl.Stagectl(args, absl::Seconds(240));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err << cl.Logs();
    return nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  };

  // Without a limit every candidate keeps the lowest level, none.
  const std::string free_spec = cl.WriteFile("auto.yaml", spec_with(""));
  const nlohmann::json free = plan({"plan", free_spec, "-o", "json"});
  ASSERT_TRUE(free.is_object() && !free["candidates"].empty()) << free;
  int64_t leanest = free["candidates"][0]["max_peak_bytes"].get<int64_t>();
  for (const nlohmann::json& c : free["candidates"]) {
    EXPECT_EQ(c["shard"].get<std::string>(), "none") << c;
    leanest = std::min(leanest, c["max_peak_bytes"].get<int64_t>());
  }
  // One byte below it: only sharded plans can fit.
  const std::string limit = absl::StrCat(leanest - 1);
  const nlohmann::json tight = plan({"plan", free_spec, "--memory-limit", limit, "-o", "json"});
  ASSERT_TRUE(tight.is_object() && !tight["candidates"].empty()) << tight;
  ASSERT_TRUE(tight["candidates"][0]["fits"].get<bool>()) << tight["candidates"][0];
  EXPECT_NE(tight["candidates"][0]["shard"].get<std::string>(), "none");

  const std::string spec = cl.WriteFile("auto-limited.yaml", spec_with(limit));
  CommandResult submit = cl.Stagectl({"submit", spec, "--wait"}, absl::Seconds(300));
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << cl.Logs();
  auto job = cl.GetJob(LastLine(submit.out));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << cl.Logs();
  ASSERT_TRUE(job->has_plan_choice());
  const v1::PlanCandidate& chosen = job->plan_choice().chosen();
  ASSERT_NE(chosen.shard(), "none");
  EXPECT_LE(chosen.max_peak_bytes(), leanest - 1);
  std::cerr << "shard: auto under " << limit << " B ran " << chosen.schedule() << ", "
            << chosen.microbatches() << " microbatches, shard " << chosen.shard() << "\n";

  ref.microbatches = kAutoReplicas * chosen.microbatches();
  const ReferenceResult want = TrainReference(ref);
  ASSERT_EQ(job->losses_size(), kSteps);
  ExpectLossesNear(std::vector<double>(job->losses().begin(), job->losses().end()), want.losses,
                   kRtol, kAtol);
  ExpectParamsMatchReference(LoadAllStageFiles(ckpt, kSteps, chosen.num_stages()), want, kRtol,
                             kAtol);
  ExpectHeldAndSentBytes(*job, chosen.shard(), "auto", kAutoReplicas);
}

INSTANTIATE_TEST_SUITE_P(
    Levels, ShardedTrainingTest,
    ::testing::Values(
        // 30 rows in 2 x 2 microbatches; an odd parameter count per stage (padding).
        Case{"1f1b-sgd", "1F1B", 2, 2, Ref({16, 32, 31, 5}, 30, 4, "sgd", 0.05, 0.9, 0.0), "step"},
        Case{"1f1b-adamw", "1F1B", 2, 2, Ref({16, 32, 31, 5}, 30, 4, "adamw", 0.01, 0.0, 0.01),
             "step"},
        // 2 ranks x 2 stages per replica.
        Case{"zbv-sgd", "ZBVZeroBubble", 4, 4,
             Ref({16, 24, 24, 23, 8}, 32, 8, "sgd", 0.05, 0.9, 0.0), "stage"},
        Case{"zbv-adamw", "ZBVZeroBubble", 4, 4,
             Ref({16, 24, 24, 23, 8}, 32, 8, "adamw", 0.01, 0.0, 0.01), "step"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.name;
      name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
      return name;
    });

}  // namespace
}  // namespace stagecoach::testing::sharded_training_test
