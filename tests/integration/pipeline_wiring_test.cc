// The pipeline executor with stages of several inputs and outputs: a skip value goes from the
// stage that produces it straight to a later stage on another rank (never through the stages in
// between), its gradient comes back the same way, and a value that carries no gradient (an
// integer mask) has no gradient message. Ranks are threads with the real Gloo data plane; every
// schedule kind trains to the same loss and gradients as the whole model run in one piece.
#include <torch/torch.h>

#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/schedule/build.h"
#include "gtest/gtest.h"
#include "tests/support/executor_ranks.h"
#include "worker/runtime/executor/message_tags.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/transport/in_memory_store.h"

namespace stagecoach::runtime::pipeline_wiring_test {
namespace {

constexpr int kWidth = 6;
constexpr int kRows = 8;
constexpr int kMicrobatches = 4;

// The model: four linear layers, where layer 0's output `a` is used by stages 1, 2 and 3, and
// an integer mask of the input (which carries no gradient) scales the last layer's output.
//   s0: a = relu(L0 x); mask = (sum(x) > 0)            -> [a, mask]
//   s1: b = relu(L1 a)                                 -> [b]
//   s2: c = relu(L2 b + a)                             -> [c]
//   s3: y = L3(c + a) * (1 + mask)                     -> [y]
struct Layers {
  std::vector<torch::nn::Linear> linear;
  explicit Layers(uint64_t seed) {
    // The default generator is process-wide and ranks are threads: build one at a time.
    std::lock_guard<std::mutex> lock(model::SeedMutex());
    torch::manual_seed(seed);
    for (int i = 0; i < 4; ++i) linear.emplace_back(kWidth, kWidth);
  }
};

torch::Tensor Scale(const torch::Tensor& mask) {
  return 1.0 + mask.unsqueeze(1).to(torch::kFloat32);
}

class SkipStage : public model::StageModel {
 public:
  SkipStage(int stage, torch::nn::Linear linear) : stage_(stage), linear_(std::move(linear)) {}

  std::vector<torch::Tensor> ForwardValues(const std::vector<torch::Tensor>& in) override {
    switch (stage_) {
      case 0:
        return {torch::relu(linear_->forward(in[0])), (in[0].sum(1) > 0).to(torch::kInt64)};
      case 1:
        return {torch::relu(linear_->forward(in[0]))};
      case 2:
        return {torch::relu(linear_->forward(in[0]) + in[1])};
      default:
        return {linear_->forward(in[0] + in[1]) * Scale(in[2])};
    }
  }
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override {
    return {{absl::StrCat(stage_, ".weight"), linear_->weight},
            {absl::StrCat(stage_, ".bias"), linear_->bias}};
  }
  void To(const torch::Device&) override {}

 private:
  int stage_;
  torch::nn::Linear linear_;
};

model::PipelineWiring SkipWiring() {
  model::PipelineWiring w(4);
  w[0] = {{{-1, 0}}, 2};
  w[1] = {{{0, 0}}, 1};
  w[2] = {{{1, 0}, {0, 0}}, 1};
  w[3] = {{{2, 0}, {0, 0}, {0, 1}}, 1};
  return w;
}

struct RankOutcome {
  absl::Status status;
  StepResult result;
  std::map<std::string, torch::Tensor> grads;
};

struct Case {
  const char* kind;
  int ranks;
  int stages_per_rank;
};

class PipelineWiringTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineWiringTest, SkipValuesTrainLikeTheWholeModelAndGoStraightToTheirConsumer) {
  const Case c = GetParam();
  auto kind = schedule::ParseScheduleKind(c.kind);
  ASSERT_TRUE(kind.ok());
  schedule::ScheduleConfig config;
  config.kind = *kind;
  config.num_ranks = c.ranks;
  config.stages_per_rank = c.stages_per_rank;
  config.num_microbatches = kMicrobatches;
  schedule::LoweringOptions lowering;
  lowering.max_active_stages = 0;
  auto built = schedule::BuildSchedule(config, lowering);
  ASSERT_TRUE(built.ok()) << built.status();
  ASSERT_EQ(built->stage_to_rank.size(), 4u);

  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({kRows, kWidth});
  const torch::Tensor target = torch::randn({kRows, kWidth});
  const std::vector<torch::Tensor> xs = torch::tensor_split(x, kMicrobatches, 0);
  const std::vector<torch::Tensor> ts = torch::tensor_split(target, kMicrobatches, 0);

  transport::InMemoryStore store;
  std::vector<RankOutcome> outcomes(c.ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.ranks; ++r) {
    threads.emplace_back([&, r] {
      RankOutcome& out = outcomes[r];
      Layers layers(11);  // every rank builds the same layers and keeps its own
      std::vector<std::unique_ptr<SkipStage>> owned;
      std::map<int, model::StageModel*> stages;
      for (int s = 0; s < 4; ++s) {
        if (built->stage_to_rank[s] != r) continue;
        owned.push_back(std::make_unique<SkipStage>(s, layers.linear[s]));
        stages[s] = owned.back().get();
      }
      auto transport = testing::ConnectThreadRank(store, "wiring/", r, c.ranks);
      if (!transport.ok()) {
        out.status = transport.status();
        return;
      }
      ExecutorOptions options;
      options.rank = r;
      options.num_stages = 4;
      options.num_microbatches = kMicrobatches;
      options.stage_to_rank = built->stage_to_rank;
      options.comm_timeout = absl::Seconds(20);
      options.wiring = SkipWiring();
      PipelineExecutor executor(options, transport->get(), stages);
      out.status = executor.AgreeShapes(testing::Float32Metas(xs));
      if (!out.status.ok()) return;
      const std::vector<schedule::Action> actions = testing::RankActions(*built, r);
      auto result = executor.RunStep(actions, stages.count(0) ? xs : std::vector<torch::Tensor>{},
                                     stages.count(3) ? ts : std::vector<torch::Tensor>{});
      if (!result.ok()) {
        out.status = result.status();
        return;
      }
      out.result = *std::move(result);
      out.grads = testing::GradientsByName(stages);
      out.status = (*transport)->Barrier(absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < c.ranks; ++r) ASSERT_TRUE(outcomes[r].status.ok()) << outcomes[r].status;

  // The whole model in one piece, on the same microbatches: the mean of their losses.
  Layers whole(11);
  torch::Tensor loss_sum = torch::zeros({});
  std::vector<double> losses;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    auto& L = whole.linear;
    torch::Tensor a = torch::relu(L[0]->forward(xs[mb]));
    torch::Tensor mask = (xs[mb].sum(1) > 0).to(torch::kInt64);
    torch::Tensor b = torch::relu(L[1]->forward(a));
    torch::Tensor cc = torch::relu(L[2]->forward(b) + a);
    torch::Tensor y = L[3]->forward(cc + a) * Scale(mask);
    torch::Tensor loss = torch::mse_loss(y, ts[mb]);
    losses.push_back(loss.item<double>());
    loss_sum = loss_sum + loss;
  }
  (loss_sum / kMicrobatches).backward();

  const int last_rank = built->stage_to_rank[3];
  ASSERT_EQ(outcomes[last_rank].result.microbatch_losses.size(), losses.size());
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    EXPECT_NEAR(outcomes[last_rank].result.microbatch_losses[mb], losses[mb], 1e-6);
  }
  for (int s = 0; s < 4; ++s) {
    const RankOutcome& out = outcomes[built->stage_to_rank[s]];
    for (const char* p : {"weight", "bias"}) {
      const std::string name = absl::StrCat(s, ".", p);
      ASSERT_EQ(out.grads.count(name), 1u) << name;
      const torch::Tensor want = std::string(p) == "weight" ? whole.linear[s]->weight.grad()
                                                            : whole.linear[s]->bias.grad();
      EXPECT_TRUE(torch::allclose(out.grads.at(name), want, 1e-5, 1e-6))
          << c.kind << " " << name << "\n"
          << out.grads.at(name) << "\nwant\n"
          << want;
    }
  }

  // Bytes between every pair of ranks: each value goes from its producer's rank straight to
  // each consumer's rank (a never passes through stage 1's or 2's rank on its way to stage 3),
  // gradients come back the same way, and the mask carries none.
  struct Edge {
    int producer, consumer;
    int64_t bytes;
    bool gradient;
  };
  const int64_t act = kRows * kWidth * 4;  // float32 [rows, width], over all microbatches
  const std::vector<Edge> edges = {{0, 1, act, true},        {0, 2, act, true}, {0, 3, act, true},
                                   {0, 3, kRows * 8, false}, {1, 2, act, true}, {2, 3, act, true}};
  for (int from = 0; from < c.ranks; ++from) {
    for (int to = 0; to < c.ranks; ++to) {
      if (from == to) continue;
      int64_t want = 0;
      for (const Edge& e : edges) {
        const int rp = built->stage_to_rank[e.producer];
        const int rc = built->stage_to_rank[e.consumer];
        if (rp == from && rc == to) want += e.bytes;
        if (e.gradient && rc == from && rp == to) want += e.bytes;
      }
      const auto& sent = outcomes[from].result.bytes_sent_to;
      const int64_t got = sent.count(to) > 0 ? sent.at(to) : 0;
      EXPECT_EQ(got, want) << c.kind << ": rank " << from << " -> rank " << to;
      const auto& received = outcomes[to].result.bytes_received_from;
      EXPECT_EQ(received.count(from) > 0 ? received.at(from) : 0, want)
          << c.kind << ": rank " << to << " <- rank " << from;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineWiringTest,
                         ::testing::Values(Case{"GPipe", 4, 1}, Case{"1F1B", 4, 1},
                                           Case{"Interleaved1F1B", 2, 2},
                                           Case{"InterleavedZeroBubble", 2, 2},
                                           Case{"ZBVZeroBubble", 2, 2}, Case{"DualPipeV", 2, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.kind, "_r", info.param.ranks);
                         });

TEST(PipelineWiringLinks, SkipPairsHaveLinksOfTheirOwnOnBothRanks) {
  const std::vector<int> stage_to_rank = {0, 1, 0, 1};
  const std::vector<SkipPair> skips = {{0, 3}};
  auto links0 = LinksOfRank(stage_to_rank, 0, false, skips);
  auto links1 = LinksOfRank(stage_to_rank, 1, false, skips);
  ASSERT_EQ(links0.size(), links1.size());
  for (size_t i = 0; i < links0.size(); ++i) EXPECT_EQ(links0[i].link, links1[i].link);
  // Three boundaries and one skip pair, three payloads each, and the job reduction's link
  // between the two ranks.
  EXPECT_EQ(links0.size(), 13u);
  EXPECT_EQ(links0.back().link, LinkOf(MessageTag(Payload::kJobReduction, 0, 0)));
  EXPECT_EQ(links0.back().peer, 1);
  EXPECT_EQ(links1.back().peer, 0);
  EXPECT_NE(PairEdge(0, 3), PairEdge(0, 1));
  EXPECT_EQ(PairEdge(2, 3), 2);
}

}  // namespace
}  // namespace stagecoach::runtime::pipeline_wiring_test
