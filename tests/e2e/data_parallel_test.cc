// Data-parallel replicas of the pipeline (placement.replicas) across real processes: a
// coordinator and replicas x workers workers on loopback train an MLP, and every step's loss and
// every stage's final parameters equal the single-process reference
// (tests/support/reference_mlp.h) trained on the whole batch split into replicas x microbatches
// microbatches in row order, within rtol 1e-5 + atol 1e-6. The gradient reduction is real: each
// rank's collectives sent exactly its stages' gradient bytes per step (the ring all-reduce moves
// 2(D-1)/D of the buffer: for D = 2 the buffer itself), and with overlap_reduction off its
// hidden ratio reads 0. With shard_optimizer (ZeRO-1) each replica keeps half of each stage's
// optimizer state (its checkpoint shard files hold ceil(N/2) elements) and sends half of its
// padded gradient (reduce-scatter) and half of its padded parameters (all-gather). Checkpoints
// resume across replica counts (2 sharded -> 1 -> 2 sharded gives the straight run's losses), and
// a worker SIGKILLed in a 2-replica job restarts the job on a spare with the straight run's
// losses.
#include <signal.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/checkpoint/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/npy_files.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/resumed_legs.h"
#include "tests/support/stage_files.h"

namespace stagecoach::testing::data_parallel_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;
constexpr int64_t kSteps = 3;

struct Case {
  std::string name;
  int replicas;
  int workers;  // per replica
  int stages;
  std::string schedule;
  int microbatches;  // per replica
  bool overlap;
  ReferenceConfig ref;  // microbatches = replicas x microbatches
  bool shard = false;   // placement.shard_optimizer
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string SpecYaml(const Case& c, const std::string& ckpt_dir) {
  const std::string spec =
      MlpSpecYaml(c.ref, {c.name, c.schedule, c.stages, c.workers, c.microbatches}, ckpt_dir);
  // A checkpoint after every step: the replicas report their parameters' digests each time, and
  // the coordinator fails the job should two replicas of a stage differ.
  return absl::StrReplaceAll(
      spec, {{absl::StrCat("checkpoint: {dir: ", ckpt_dir, "}"),
              absl::StrCat("checkpoint: {dir: ", ckpt_dir, ", every_steps: 1}")},
             {absl::StrCat("placement: {workers: ", c.workers, "}"),
              absl::StrCat("placement: {workers: ", c.workers, ", replicas: ", c.replicas,
                           ", overlap_reduction: ", c.overlap ? "true" : "false",
                           ", shard_optimizer: ", c.shard ? "true" : "false", "}")}});
}

int64_t CeilHalf(int64_t n) { return (n + 1) / 2; }

// The elements of the tensor `key` in the pickled dict `path`'s `dict` entry.
int64_t NumelIn(const std::string& path, const std::string& dict, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue root = torch::pickle_load(bytes);
  for (const auto& entry : root.toGenericDict()) {
    if (entry.key().toStringRef() != dict) continue;
    for (const auto& inner : entry.value().toGenericDict()) {
      if (inner.key().toStringRef() == key) return inner.value().toTensor().numel();
    }
  }
  return -1;
}

class DataParallelTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    // One intra-op thread per worker: up to 8 workers share this machine's cores.
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }
};

TEST_P(DataParallelTest, MatchesTheUnpipelinedReferenceOnTheWholeBatch) {
  const Case& c = GetParam();
  ClusterOptions options;
  options.workers = c.replicas * c.workers;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string ckpt = (*cluster)->dir() + "/ckpt";
  const std::string spec = (*cluster)->WriteFile("spec.yaml", SpecYaml(c, ckpt));

  CommandResult submit = (*cluster)->Stagectl({"submit", spec, "--wait"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err << (*cluster)->Logs();
  const std::string job_id = LastLine(submit.out);
  auto job = (*cluster)->GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
  EXPECT_EQ(job->replicas(), c.replicas);

  const ReferenceResult ref = TrainReference(c.ref);
  ASSERT_EQ(job->losses_size(), kSteps);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(job->losses(step), ref.losses[step], kAtol + kRtol * std::abs(ref.losses[step]))
        << "step " << step;
  }
  const double max_param_diff =
      ExpectParamsMatchReference(LoadAllStageFiles(ckpt, kSteps, c.stages), ref, kRtol, kAtol);
  std::cerr << c.name << ": largest |parameter - reference| " << max_param_diff << "\n";

  // One task per (replica, rank), replica by replica; each reduced exactly its stages'
  // gradients every step (the ring all-reduce of 2 replicas sends each buffer once; sharded, the
  // reduce-scatter sends half the padded gradient and the all-gather half the padded
  // parameters).
  ASSERT_EQ(job->ranks_size(), c.replicas * c.workers);
  std::map<int, int64_t> stage_params;
  for (const auto& st : job->stages()) stage_params[st.stage()] = st.parameters();
  for (int i = 0; i < job->ranks_size(); ++i) {
    const v1::RankStatus& rank = job->ranks(i);
    EXPECT_EQ(rank.replica(), i / c.workers);
    EXPECT_EQ(rank.rank(), i % c.workers);
    EXPECT_EQ(rank.steps_done(), kSteps);
    ASSERT_GT(rank.parameters(), 0);
    if (c.replicas == 2) {
      int64_t per_step = 0;
      for (int s : rank.stages()) {
        per_step += c.shard ? 2 * CeilHalf(stage_params[s]) : stage_params[s];
      }
      EXPECT_EQ(rank.reduction_bytes_sent(), kSteps * per_step * 4)
          << "replica " << rank.replica() << " rank " << rank.rank();
    }
    if (c.shard) {
      // Each replica's shard of each stage holds half of its optimizer state.
      for (int s : rank.stages()) {
        const std::string file =
            absl::StrCat(checkpoint::CheckpointStepDirectory(ckpt, kSteps), "/stage-", s,
                         ".optimizer-", rank.replica(), "-of-2.pt");
        EXPECT_EQ(NumelIn(file, "state_dict", "shard"), CeilHalf(stage_params[s])) << file;
        if (c.ref.optimizer == "adamw") {
          EXPECT_EQ(NumelIn(file, "optimizer", "shard.exp_avg"), CeilHalf(stage_params[s])) << file;
        }
      }
    }
    // The replicas of each stage held the same bits after every step (the coordinator compared
    // their digests at each step's checkpoint); the last ones are in the status.
    const v1::RankStatus& same_rank_of_replica_0 = job->ranks(i % c.workers);
    ASSERT_EQ(rank.parameter_digests_size(), rank.stages_size());
    for (int s : rank.stages()) {
      EXPECT_EQ(rank.parameter_digests().at(s), same_rank_of_replica_0.parameter_digests().at(s))
          << "stage " << s;
    }
    EXPECT_GE(rank.reduction_hidden_ratio(), 0.0);
    EXPECT_LE(rank.reduction_hidden_ratio(), 1.0);
    if (!c.overlap) EXPECT_EQ(rank.reduction_hidden_ratio(), 0.0);
    std::cerr << c.name << ": replica " << rank.replica() << " rank " << rank.rank()
              << " hidden ratio of the last step " << rank.reduction_hidden_ratio() << "\n";
  }
}

ReferenceConfig Ref(std::vector<int64_t> sizes, int64_t batch, int microbatches, std::string loss,
                    std::string optimizer, double lr, double momentum, double weight_decay) {
  return MlpReference(std::move(sizes), 7, 99, batch, microbatches, kSteps, std::move(loss),
                      std::move(optimizer), lr, momentum, weight_decay);
}

// A job of the resume and restart tests: the MLP of `ref` as 2 stages on 2 ranks per replica.
std::string ChainSpec(const std::string& name, const ReferenceConfig& ref, int replicas, bool shard,
                      int64_t steps, const std::string& ckpt, const std::string& resume_from,
                      const std::string& extra) {
  ReferenceConfig r = ref;
  r.steps = steps;
  const int m = ref.microbatches / replicas;
  std::string spec = MlpSpecYaml(r, {name, "1F1B", 2, 2, m}, ckpt);
  spec = absl::StrReplaceAll(
      spec, {{"placement: {workers: 2}",
              absl::StrCat("placement: {workers: 2, replicas: ", replicas,
                           ", shard_optimizer: ", shard ? "true" : "false", "}")}});
  if (!resume_from.empty()) {
    spec = absl::StrReplaceAll(
        spec,
        {{"\n  checkpoint:", absl::StrCat("\n  resume_from: ", resume_from, "\n  checkpoint:")}});
  }
  return spec + extra;
}

class DataParallelCheckpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MKL_NUM_THREADS", "1", 1);
  }
};

TEST_F(DataParallelCheckpoints, ResumeFromTwoShardedReplicasOntoOneAndBackGivesTheStraightRun) {
  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // 6 steps of AdamW on 4 microbatches: 2 replicas x 2 or 1 replica x 4 split the same rows.
  ReferenceConfig ref = Ref({16, 32, 32, 8}, 24, 4, "mse", "adamw", 0.01, 0.0, 0.01);
  ref.steps = 6;
  const ReferenceResult want = TrainReference(ref);

  struct Leg {
    int replicas;
    bool shard;
  };
  const std::vector<Leg> legs = {{2, true}, {1, false}, {2, true}};
  ResumedLegs run;
  RunResumedLegs(
      c, "leg", 3, 2,
      [&](int i, const std::string& ckpt, const std::string& resume_from) {
        return ChainSpec(absl::StrCat("leg-", i), ref, legs[i].replicas, legs[i].shard, 2, ckpt,
                         resume_from, "");
      },
      &run);
  if (HasFatalFailure()) return;
  ExpectLossesNear(run.losses, want.losses, kRtol, kAtol);
  ExpectParamsMatchReference(LoadAllStageFiles(run.last_checkpoint_dir, 6, 2), want, kRtol, kAtol);
}

TEST_F(DataParallelCheckpoints, ClientBatchesAndInferenceSplitTheBatchOverTheReplicas) {
  ClusterOptions options;
  options.workers = 4;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const ReferenceConfig ref = Ref({16, 32, 32, 8}, 24, 4, "mse", "sgd", 0.05, 0.0, 0.0);
  // 10 rows in 2 replicas x 2 microbatches: 3, 3 | 2, 2.
  torch::manual_seed(77);
  const torch::Tensor x = torch::randn({10, 16});
  const torch::Tensor y = torch::randn({10, 8});
  const std::string x_path = c.dir() + "/x.npy", y_path = c.dir() + "/y.npy";
  WriteNpy(x_path, x);
  WriteNpy(y_path, y);
  const torch::Tensor want0 = ReferenceForward(ref.sizes, ref.model_seed, x);

  // Infer with 2 replicas: every input row's output, in order.
  const std::string infer_spec = c.WriteFile(
      "infer.yaml", ChainSpec("infer", ref, 2, false, 1, c.dir() + "/ckpt-infer", "", ""));
  const std::string infer_out = c.dir() + "/infer-out.npy";
  CommandResult infer = c.Stagectl({"infer", infer_spec, "--input", x_path, "--out", infer_out});
  ASSERT_EQ(infer.exit_code, 0) << infer.out << infer.err << c.Logs();
  const torch::Tensor inferred = ReadNpy(infer_out);
  ASSERT_TRUE(inferred.defined());
  EXPECT_TRUE(torch::allclose(inferred, want0, kRtol, kAtol)) << inferred << want0;
  ASSERT_TRUE(c.WaitForIdleWorkers(4, absl::Seconds(30)).ok()) << c.Logs();

  // A paused 2-replica job: a forward-only client step, then a training one.
  auto id = c.Submit(ChainSpec("client", ref, 2, false, 5, c.dir() + "/ckpt-client", "", ""),
                     /*paused=*/true);
  ASSERT_TRUE(id.ok()) << id.status();
  auto held = c.WaitForJob(
      *id, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_PAUSED || IsFinal(j); },
      absl::Seconds(60));
  ASSERT_TRUE(held.ok() && held->state() == v1::JOB_STATE_PAUSED) << c.Logs();
  const std::string out0 = c.dir() + "/out0.npy";
  CommandResult fwd = c.Stagectl(
      {"step", *id, "--inputs", x_path, "--forward-only", "--save-outputs", out0, "-o", "json"});
  ASSERT_EQ(fwd.exit_code, 0) << fwd.out << fwd.err << c.Logs();
  EXPECT_TRUE(torch::allclose(ReadNpy(out0), want0, kRtol, kAtol));

  ReferenceConfig on_batch = ref;
  on_batch.batch_size = 10;
  on_batch.steps = 1;
  on_batch.dataset_inputs = x;
  on_batch.dataset_targets = y;
  const ReferenceResult want = TrainReference(on_batch);
  CommandResult train =
      c.Stagectl({"step", *id, "--inputs", x_path, "--targets", y_path, "-o", "json"});
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err << c.Logs();
  const nlohmann::json t = nlohmann::json::parse(train.out);
  ASSERT_TRUE(t["loss"].is_number()) << train.out;
  EXPECT_NEAR(t["loss"].get<double>(), want.losses[0], kAtol + kRtol * want.losses[0]);
  EXPECT_EQ(t["microbatch_losses"].size(), 4u);  // both replicas' microbatches, in order

  // A batch smaller than 2 replicas x 2 microbatches is refused naming the count.
  const std::string small = c.dir() + "/small.npy";
  WriteNpy(small, torch::randn({3, 16}));
  CommandResult refused = c.Stagectl({"step", *id, "--inputs", small, "--forward-only"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, ::testing::HasSubstr("2 per replica x 2 replicas")) << refused.err;
  ASSERT_TRUE(c.Cancel(*id).ok());
}

TEST_F(DataParallelCheckpoints, AKilledWorkerOfAReplicaRestartsTheJobOnTheSpare) {
  ClusterOptions options;
  options.workers = 5;  // 2 replicas x 2 ranks and a spare
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ReferenceConfig ref = Ref({16, 32, 32, 8}, 24, 4, "mse", "adamw", 0.01, 0.0, 0.01);
  ref.steps = 8;
  const ReferenceResult want = TrainReference(ref);

  const std::string ckpt = c.dir() + "/ckpt";
  std::string spec = ChainSpec("killed", ref, 2, false, 8, ckpt, "",
                               "restart: {max_restarts: 1, carry_on: false}\n");
  spec = absl::StrReplaceAll(spec, {{"checkpoint: {dir: " + ckpt + "}",
                                     "checkpoint: {dir: " + ckpt + ", every_steps: 2}"}});
  auto id = c.Submit(spec, /*paused=*/true);
  ASSERT_TRUE(id.ok()) << id.status();
  auto held = c.WaitForJob(
      *id, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_PAUSED || IsFinal(j); },
      absl::Seconds(60));
  ASSERT_TRUE(held.ok()) << held.status();
  CommandResult run = c.Stagectl({"run", *id, "--steps", "3"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  held = c.WaitForJob(
      *id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.state() == v1::JOB_STATE_PAUSED && j.global_steps_done() == 3 &&
                              j.checkpoints_size() >= 1);
      },
      absl::Seconds(60));
  ASSERT_TRUE(held.ok()) << held.status() << c.Logs();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason() << c.Logs();
  // Kill replica 1's rank 0.
  std::string victim;
  for (const v1::RankStatus& r : held->ranks()) {
    if (r.replica() == 1 && r.rank() == 0) victim = r.worker_id();
  }
  ASSERT_FALSE(victim.empty());
  const int index = c.WorkerIndex(victim);
  ASSERT_GE(index, 0);
  c.worker(index).Signal(SIGKILL);
  auto again = c.WaitForJob(
      *id,
      [](const v1::Job& j) {
        return IsFinal(j) || (j.restarts() == 1 && j.state() == v1::JOB_STATE_PAUSED &&
                              j.global_steps_done() == 3);
      },
      absl::Seconds(90));
  ASSERT_TRUE(again.ok()) << again.status() << c.Logs();
  ASSERT_EQ(again->state(), v1::JOB_STATE_PAUSED) << again->reason() << c.Logs();
  EXPECT_EQ(again->failure().replica(), 1);
  EXPECT_EQ(again->failure().rank(), 0);
  CommandResult resume = c.Stagectl({"resume", *id});
  ASSERT_EQ(resume.exit_code, 0) << resume.err;
  auto done = c.WaitForJob(*id, IsFinal, absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  ASSERT_EQ(done->losses_size(), 8);
  for (int step = 0; step < 8; ++step) {
    EXPECT_NEAR(done->losses(step), want.losses[step], kAtol + kRtol * std::abs(want.losses[step]))
        << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Replicas, DataParallelTest,
    ::testing::Values(
        // 30 rows in 2 x 2 microbatches: 8, 8 | 7, 7.
        Case{"two-replicas-1f1b-sgd", 2, 2, 2, "1F1B", 2, true,
             Ref({16, 32, 32, 32, 5}, 30, 4, "cross_entropy", "sgd", 0.05, 0.9, 0.0)},
        Case{"two-replicas-gpipe-adamw", 2, 2, 2, "GPipe", 3, true,
             Ref({16, 32, 32, 8}, 24, 6, "mse", "adamw", 0.01, 0.0, 0.01)},
        Case{"two-replicas-1f1b-adamw-no-overlap", 2, 2, 2, "1F1B", 2, false,
             Ref({16, 32, 32, 8}, 16, 4, "mse", "adamw", 0.01, 0.0, 0.01)},
        // ZeRO-1; an odd parameter count per stage (padding).
        Case{"two-replicas-1f1b-adamw-sharded", 2, 2, 2, "1F1B", 2, true,
             Ref({16, 32, 31, 5}, 30, 4, "cross_entropy", "adamw", 0.01, 0.0, 0.01), true},
        Case{"two-replicas-gpipe-sgd-sharded", 2, 2, 2, "GPipe", 3, true,
             Ref({16, 32, 32, 8}, 24, 6, "mse", "sgd", 0.05, 0.9, 0.0), true},
        // 2 replicas x 4 ranks x 2 stages per rank: 8 workers.
        Case{
            "two-replicas-zbv-sgd", 2, 4, 8, "ZBVZeroBubble", 4, true,
            Ref({16, 24, 24, 24, 24, 24, 24, 24, 8}, 32, 8, "cross_entropy", "sgd", 0.5, 0.9, 0.0)},
        Case{"two-replicas-zbv-adamw-sharded", 2, 4, 8, "ZBVZeroBubble", 4, true,
             Ref({16, 24, 24, 24, 24, 24, 24, 24, 8}, 32, 8, "mse", "adamw", 0.01, 0.0, 0.01),
             true}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.name;
      name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
      return name;
    });

}  // namespace
}  // namespace stagecoach::testing::data_parallel_test
