// ZeRO's shards below the task, on real collectives (the ring over Gloo, two replicas as
// threads): ZeroShards at levels gradients and parameters, and ParameterGathering as the
// executor drives it through UNSHARD and RESHARD. What the stage holds is read from the
// counting allocator (sharding/held_memory.h), not computed from shapes.
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/spec/job_spec.h"
#include "common/util/work_queue.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/collectives/ring/factory.h"
#include "worker/model/mlp.h"
#include "worker/runtime/device/counting_allocator.h"
#include "worker/runtime/executor/progress_beacon.h"
#include "worker/runtime/sharding/held_memory.h"
#include "worker/runtime/sharding/parameter_gathering.h"
#include "worker/runtime/sharding/zero_shards.h"
#include "worker/runtime/task/client_steps.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace stagecoach::runtime::sharded_parameters_test {
namespace {

using ::testing::HasSubstr;

constexpr int kReplicas = 2;
// 6x10 + 10 + 10x3 + 3 = 103 parameters: an odd count, so the shards hold c = 52 elements and
// the last replica's ends in one element of padding.
constexpr int64_t kParameters = 103;
constexpr int64_t kShard = 52;
constexpr int64_t kFloat = 4;

spec::BuiltinModel Mlp() {
  spec::BuiltinModel m;
  m.family = "mlp";
  m.sizes = {6, 10, 3};
  m.seed = 5;
  return m;
}

absl::StatusOr<std::vector<std::unique_ptr<collectives::Collectives>>> RingGroup() {
  static std::atomic<int> groups{0};
  const std::string prefix = absl::StrCat("sharded", groups++, "/");
  transport::InMemoryStore store;
  std::vector<absl::StatusOr<std::unique_ptr<collectives::Collectives>>> made(kReplicas);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kReplicas; ++rank) {
    threads.emplace_back([&, rank] {
      transport::GlooOptions options;
      options.rank = rank;
      options.world_size = kReplicas;
      options.key_prefix = prefix;
      options.connect_timeout = absl::Seconds(20);
      auto t = transport::CreateGlooTransport(options, &store);
      made[rank] = t.ok() ? collectives::CreateRingCollectives(*std::move(t))
                          : absl::StatusOr<std::unique_ptr<collectives::Collectives>>(t.status());
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<collectives::Collectives>> group;
  for (auto& m : made) {
    if (!m.ok()) return m.status();
    group.push_back(*std::move(m));
  }
  return group;
}

// One replica's stage (the whole MLP) and its shards.
struct Replica {
  std::unique_ptr<model::StageModel> stage;
  std::map<int, model::StageModel*> stages;
  std::unique_ptr<ZeroShards> shards;
};

class ShardedParametersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CountingCpuAllocator::Install();  // before the stages are built, so their memory counts
  }

  // Both replicas' stages at `level`; the parameters as built, by name, in `whole`.
  void Build(spec::ShardLevel level, std::map<std::string, torch::Tensor>* whole = nullptr) {
    for (int k = 0; k < kReplicas; ++k) {
      auto stage = model::BuildMlpStage(Mlp(), 0, 2);
      ASSERT_TRUE(stage.ok()) << stage.status();
      replicas_[k].stage = *std::move(stage);
      replicas_[k].stages = {{0, replicas_[k].stage.get()}};
      auto shards = ZeroShards::Create(replicas_[k].stages, k, kReplicas, level);
      ASSERT_TRUE(shards.ok()) << shards.status();
      replicas_[k].shards = *std::move(shards);
    }
    if (whole != nullptr) {
      for (const auto& [name, p] : replicas_[0].stage->NamedParameters()) {
        (*whole)[name] = p.detach().clone();
      }
    }
  }

  // Runs fn(k) for both replicas at once (their collectives meet).
  static void OnBothReplicas(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int k = 0; k < kReplicas; ++k) threads.emplace_back(fn, k);
    for (std::thread& t : threads) t.join();
  }

  HeldMemory Held(int k) const {
    return MeasureHeldMemory(replicas_[k].stages, replicas_[k].shards.get());
  }

  // A data-parallel group of both replicas, and each replica's gathering over it (which
  // releases its stage's parameters).
  void StartGathering(absl::Duration timeout = absl::Seconds(20)) {
    auto group = RingGroup();
    ASSERT_TRUE(group.ok()) << group.status();
    group_ = *std::move(group);
    for (int k = 0; k < kReplicas; ++k) {
      comm_[k] = std::make_unique<WorkQueue>(1);
      gathering_[k] = std::make_unique<ParameterGathering>(
          replicas_[k].shards.get(), group_[k].get(), comm_[k].get(), timeout);
    }
  }

  // Destroyed in reverse order: the gatherings before their queues, group and shards.
  Replica replicas_[kReplicas];
  std::vector<std::unique_ptr<collectives::Collectives>> group_;
  std::unique_ptr<WorkQueue> comm_[kReplicas];
  std::unique_ptr<ParameterGathering> gathering_[kReplicas];
};

TEST_F(ShardedParametersTest, UnshardGathersTheWholeParametersAndReshardFreesThem) {
  std::map<std::string, torch::Tensor> whole;
  Build(spec::ShardLevel::kParameters, &whole);
  ASSERT_NO_FATAL_FAILURE(StartGathering());
  std::unique_ptr<ParameterGathering>* gathering = gathering_;
  for (int k = 0; k < kReplicas; ++k) {
    // Released at once: the parameters hold nothing, the shard c elements.
    for (const torch::Tensor& p : replicas_[k].stage->Parameters()) EXPECT_EQ(p.numel(), 0);
    EXPECT_EQ(Held(k).parameter_bytes, kShard * kFloat) << "replica " << k;
    EXPECT_EQ(Held(k).gradient_bytes, 0);
  }
  absl::Status status[kReplicas];
  OnBothReplicas([&](int k) {
    gathering[k]->BeginStep(absl::Now());
    gathering[k]->Unshard(0);
    status[k] = gathering[k]->AwaitGathered(0, "test UNSHARD").status();
  });
  for (int k = 0; k < kReplicas; ++k) {
    ASSERT_TRUE(status[k].ok()) << status[k];
    for (const auto& [name, p] : replicas_[k].stage->NamedParameters()) {
      EXPECT_TRUE(torch::equal(p, whole.at(name))) << "replica " << k << " " << name;
    }
    // The shard and one gathered buffer of both replicas' shards (the padding included).
    EXPECT_EQ(Held(k).parameter_bytes, (kShard + kReplicas * kShard) * kFloat);
    const GatherReport report = gathering[k]->Report();
    ASSERT_EQ(report.gathers.size(), 1u);
    EXPECT_EQ(report.gathers[0].stage, 0);
    EXPECT_EQ(report.gathers[0].bytes, kReplicas * kShard * kFloat);
    EXPECT_GE(report.hidden_ratio, 0.0);
    EXPECT_LE(report.hidden_ratio, 1.0);
    ASSERT_TRUE(gathering[k]->Reshard(0, "test RESHARD").ok());
    for (const torch::Tensor& p : replicas_[k].stage->Parameters()) EXPECT_EQ(p.numel(), 0);
    EXPECT_EQ(Held(k).parameter_bytes, kShard * kFloat);
  }
  // Between steps (a checkpoint, an evaluation): every stage at once, and back.
  OnBothReplicas([&](int k) { status[k] = gathering[k]->GatherAll(); });
  for (int k = 0; k < kReplicas; ++k) {
    ASSERT_TRUE(status[k].ok()) << status[k];
    for (const auto& [name, p] : replicas_[k].stage->NamedParameters()) {
      EXPECT_TRUE(torch::equal(p, whole.at(name))) << name;
    }
    gathering[k]->ReleaseAll();
    EXPECT_EQ(Held(k).parameter_bytes, kShard * kFloat);
  }
}

TEST_F(ShardedParametersTest, ComputeOnAShardedStageAndAStrayReshardAreRefused) {
  Build(spec::ShardLevel::kParameters);
  ASSERT_NO_FATAL_FAILURE(StartGathering());
  ParameterGathering& gathering = *gathering_[0];
  const absl::StatusOr<absl::Duration> waited = gathering.AwaitGathered(0, "rank 0, action 0F0");
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(waited.status().message(),
            "rank 0, action 0F0: stage 0's parameters are sharded (no UNSHARD since its last "
            "RESHARD)");
  const absl::Status reshard = gathering.Reshard(0, "rank 0, action 0RESHARD");
  EXPECT_EQ(reshard.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reshard.message(),
            "rank 0, action 0RESHARD: stage 0's parameters are not gathered (no UNSHARD)");
  // A stage this rank does not hold has nothing to gather.
  EXPECT_TRUE(gathering.AwaitGathered(7, "rank 0, action 7F0").ok());
}

TEST_F(ShardedParametersTest, PlaceholdersGiveTheShapesUntilPutBack) {
  std::map<std::string, torch::Tensor> whole;
  Build(spec::ShardLevel::kParameters, &whole);
  ASSERT_NO_FATAL_FAILURE(StartGathering());
  ParameterGathering& gathering = *gathering_[0];
  const std::function<void()> put_back = gathering.Placeholders(0);
  for (const auto& [name, p] : replicas_[0].stage->NamedParameters()) {
    EXPECT_EQ(p.sizes(), whole.at(name).sizes()) << name;
    EXPECT_EQ(p.abs().sum().item<float>(), 0.0f) << name;
    EXPECT_TRUE(p.requires_grad()) << name;
  }
  put_back();
  for (const torch::Tensor& p : replicas_[0].stage->Parameters()) EXPECT_EQ(p.numel(), 0);
}

// A client step's check of stage 0 runs while the task holds, on parameters that are empty
// between steps: it runs on zeros of their shapes and leaves them empty.
TEST_F(ShardedParametersTest, AClientStepsCheckRunsOnZerosOfTheShapes) {
  Build(spec::ShardLevel::kParameters);
  ASSERT_NO_FATAL_FAILURE(StartGathering());
  ParameterGathering& gathering = *gathering_[0];
  model::StageModel& stage = *replicas_[0].stage;
  const std::vector<torch::Tensor> batch = {torch::ones({4, 6})};
  EXPECT_FALSE(CheckStage0Takes(batch, stage, "client_step.inputs").ok())
      << "empty parameters cannot run";
  {
    const ParameterShapes shapes = replicas_[0].shards->ShapesOf(0);
    std::function<void()> empty_again = FillEmptyWithZeros(shapes);
    EXPECT_TRUE(CheckStage0Takes(batch, stage, "client_step.inputs").ok());
    const absl::Status wrong = CheckStage0Takes({torch::ones({4, 5})}, stage, "client_step.inputs");
    EXPECT_THAT(std::string(wrong.message()),
                HasSubstr("client_step.inputs: stage 0 cannot take microbatch 0 of shape"));
    empty_again();
  }
  for (const torch::Tensor& p : stage.Parameters()) EXPECT_EQ(p.numel(), 0);
}

TEST_F(ShardedParametersTest, ALateReplicaFailsTheGatherWithinTheTimeoutNamingTheAction) {
  Build(spec::ShardLevel::kParameters);
  ASSERT_NO_FATAL_FAILURE(StartGathering(absl::Milliseconds(500)));
  ParameterGathering& gathering = *gathering_[0];
  // Replica 1 never gathers.
  gathering.Unshard(0);
  const absl::Time start = absl::Now();
  const absl::StatusOr<absl::Duration> waited = gathering.AwaitGathered(0, "rank 0, action 0F0");
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(waited.ok());
  EXPECT_THAT(std::string(waited.status().message()), HasSubstr("rank 0, action 0F0: "));
  EXPECT_THAT(std::string(waited.status().message()), HasSubstr("stage 0"));
}

// While the compute thread waits for a gather, its beacon says so (the coordinator's stall rule
// names the replicas it waits on); replica 1 joins the gather only once it has seen that.
TEST_F(ShardedParametersTest, AWaitForAGatherShowsOnTheBeaconUntilTheGatherEnds) {
  Build(spec::ShardLevel::kParameters);
  ASSERT_NO_FATAL_FAILURE(StartGathering());
  ProgressBeacon beacon("job-1", 1, /*rank=*/0, /*replica=*/0);
  gathering_[0]->set_progress(&beacon);
  beacon.BeginStep(0);
  beacon.BeginAction("0F0");
  v1::RankWait seen;
  absl::Status late;
  std::thread replica1([&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!beacon.Read().has_wait() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    seen = beacon.Read().wait();
    gathering_[1]->Unshard(0);
    late = gathering_[1]->AwaitGathered(0, "replica 1, action 0F0").status();
  });
  gathering_[0]->Unshard(0);
  const absl::StatusOr<absl::Duration> waited = gathering_[0]->AwaitGathered(0, "action 0F0");
  replica1.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  ASSERT_TRUE(late.ok()) << late;
  EXPECT_EQ(seen.kind(), "ALL_GATHER");
  EXPECT_EQ(seen.stage(), 0);
  EXPECT_EQ(seen.peer_rank(), -1);
  EXPECT_GT(*waited, absl::ZeroDuration());
  EXPECT_FALSE(beacon.Read().has_wait()) << "the wait ends with the gather";
  EXPECT_EQ(beacon.Read().action(), "0F0") << "the action goes on";
  // A stage gathered already: no wait to show.
  ASSERT_TRUE(gathering_[0]->AwaitGathered(0, "action 0F1").ok());
  EXPECT_FALSE(beacon.Read().has_wait());
}

TEST_F(ShardedParametersTest, FromLevelGradientsTheReduceScatteredShardFreesTheFullGradients) {
  for (spec::ShardLevel level : {spec::ShardLevel::kOptimizer, spec::ShardLevel::kGradients}) {
    SCOPED_TRACE(spec::ShardLevelName(level));
    Build(level);
    ZeroShards& shards = *replicas_[0].shards;
    for (torch::Tensor& p : replicas_[0].stage->Parameters()) {
      p.mutable_grad() = torch::ones_like(p);
    }
    EXPECT_EQ(Held(0).gradient_bytes, kParameters * kFloat);
    shards.SetShardGradient(0, torch::full({kShard}, 2.0f));
    const bool freed = level >= spec::ShardLevel::kGradients;
    for (const torch::Tensor& p : replicas_[0].stage->Parameters()) {
      EXPECT_EQ(p.grad().defined(), !freed);
    }
    EXPECT_EQ(Held(0).gradient_bytes, (freed ? 0 : kParameters * kFloat) + kShard * kFloat);
    // Flattening for the reduce-scatter: the padded gradients in order, each parameter's
    // gradient freed once copied from level gradients on.
    for (torch::Tensor& p : replicas_[0].stage->Parameters()) {
      p.mutable_grad() = torch::ones_like(p);
    }
    const torch::Tensor flat = shards.FlatGradients(0, torch::kCPU);
    ASSERT_EQ(flat.numel(), kReplicas * kShard);
    EXPECT_EQ(flat.narrow(0, 0, kParameters).sum().item<float>(), kParameters);
    EXPECT_EQ(flat.narrow(0, kParameters, kReplicas * kShard - kParameters).sum().item<float>(), 0);
    for (const torch::Tensor& p : replicas_[0].stage->Parameters()) {
      EXPECT_EQ(p.grad().defined(), !freed);
    }
  }
}

}  // namespace
}  // namespace stagecoach::runtime::sharded_parameters_test
