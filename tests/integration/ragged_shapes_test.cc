// Microbatches whose shapes differ from each other and from the step before, through the
// pipeline executor (ExecutorOptions::dynamic_shapes): ranks are threads with the real Gloo data
// plane, stages are the built-in GPT's, token rows of lengths from 1 to seq with padded targets.
// On every kind of schedule (split I/W, OVERLAP_F_B and recomputation included), with the shape
// header framed with each activation (Gloo) and, on some, ahead of it (as on NCCL), two steps of
// ragged microbatches give the losses and gradients of the whole model run in one piece on the
// same microbatches, with the loss the mean of the microbatch means or normalised by the
// tokens that count. A value larger than planned is refused, naming it; without dynamic shapes,
// any shape but the agreed one still is.
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/build.h"
#include "gtest/gtest.h"
#include "tests/support/exact_receives_transport.h"
#include "tests/support/executor_ranks.h"
#include "worker/model/gpt.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/transport/in_memory_store.h"

namespace stagecoach::runtime::ragged_shapes_test {
namespace {

constexpr int kMicrobatches = 4;
constexpr int64_t kRows = 2;  // per microbatch
constexpr int64_t kSeq = 10;

spec::BuiltinModel Gpt() {
  spec::BuiltinModel m;
  m.family = "gpt";
  m.vocab = 24;
  m.d_model = 16;
  m.layers = 4;
  m.heads = 2;
  m.seq = kSeq;
  m.seed = 11;
  return m;
}
constexpr int kGptLayers = 4 + 3;

// One step's microbatches: inputs [kRows, L] and targets [kRows, L], L drawn per microbatch;
// the second row's last positions are padding (input 0, target ignored) as a padded batch has.
struct Batch {
  std::vector<torch::Tensor> inputs, targets;
};

Batch RaggedBatch(const std::vector<int64_t>& lengths, uint64_t seed) {
  torch::manual_seed(seed);
  Batch b;
  for (int64_t len : lengths) {
    torch::Tensor x = torch::randint(1, 24, {kRows, len}, torch::kInt64);
    torch::Tensor y = torch::randint(0, 24, {kRows, len}, torch::kInt64);
    const int64_t pad = len / 3;
    if (pad > 0) {
      x[1].slice(0, len - pad).fill_(0);
      y[1].slice(0, len - pad).fill_(kIgnoredTarget);
    }
    b.inputs.push_back(x);
    b.targets.push_back(y);
  }
  return b;
}

// Two steps, each microbatch's length differing from its neighbours' and from the step before.
std::vector<Batch> TwoSteps() {
  return {RaggedBatch({kSeq, 3, 7, 1}, 21), RaggedBatch({5, kSeq, 2, 9}, 22)};
}

int64_t Counted(const Batch& b) {
  int64_t n = 0;
  for (const torch::Tensor& y : b.targets) n += y.ne(kIgnoredTarget).sum().item<int64_t>();
  return n;
}

struct StepOutcome {
  std::vector<double> losses;                  // the last stage's rank only
  std::map<std::string, torch::Tensor> grads;  // this rank's stages
};

struct RankOutcome {
  absl::Status status;
  std::vector<StepOutcome> steps;
};

struct Case {
  std::string kind;
  int stages_per_rank;
  bool recompute;
  bool tokens;
  // The shape header ahead of each activation, as on a transport of exact receives (NCCL),
  // rather than framed with it (Gloo).
  bool header_ahead = false;
};

std::vector<RankOutcome> RunPipeline(const Case& c, const std::vector<Batch>& steps) {
  constexpr int kRanks = 2;
  auto parsed = schedule::ParseScheduleKind(c.kind);
  EXPECT_TRUE(parsed.ok());
  schedule::ScheduleConfig config;
  config.kind = *parsed;
  config.num_ranks = kRanks;
  config.stages_per_rank = c.stages_per_rank;
  config.num_microbatches = kMicrobatches;
  schedule::LoweringOptions lowering;
  lowering.max_active_stages = 0;
  auto built = schedule::BuildSchedule(config, lowering);
  EXPECT_TRUE(built.ok()) << built.status();
  const int num_stages = static_cast<int>(built->stage_to_rank.size());

  transport::InMemoryStore store;
  std::vector<RankOutcome> outcomes(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      RankOutcome& out = outcomes[r];
      std::vector<std::unique_ptr<model::StageModel>> owned;
      std::map<int, model::StageModel*> stages;
      for (int s = 0; s < num_stages; ++s) {
        if (built->stage_to_rank[s] != r) continue;
        auto stage = model::BuildGptStage(Gpt(), s * kGptLayers / num_stages,
                                          (s + 1) * kGptLayers / num_stages);
        if (!stage.ok()) {
          out.status = stage.status();
          return;
        }
        owned.push_back(*std::move(stage));
        stages[s] = owned.back().get();
      }
      auto transport = testing::ConnectThreadRank(store, "ragged/", r, kRanks);
      if (!transport.ok()) {
        out.status = transport.status();
        return;
      }
      if (c.header_ahead) {
        *transport = std::make_unique<testing::ExactReceivesTransport>(*std::move(transport));
      }
      ExecutorOptions options;
      options.rank = r;
      options.num_stages = num_stages;
      options.num_microbatches = kMicrobatches;
      options.stage_to_rank = built->stage_to_rank;
      options.comm_timeout = absl::Seconds(20);
      options.loss = LossKind::kCrossEntropy;
      options.recompute = c.recompute;
      options.dynamic_shapes = true;
      PipelineExecutor executor(options, transport->get(), stages);
      // Planned for the largest microbatch: kRows rows of seq tokens.
      out.status = executor.AgreeShapes(
          std::vector<TensorMeta>(kMicrobatches, TensorMeta{{kRows, kSeq}, torch::kInt64}));
      if (!out.status.ok()) return;
      const std::vector<schedule::Action> actions = testing::RankActions(*built, r);
      for (const Batch& batch : steps) {
        std::optional<TokenNormalization> tokens;
        if (c.tokens) tokens = TokenNormalization{Counted(batch), 1.0};
        auto result = executor.RunStep(
            actions, stages.count(0) ? batch.inputs : std::vector<torch::Tensor>{},
            stages.count(num_stages - 1) ? batch.targets : std::vector<torch::Tensor>{}, tokens);
        if (!result.ok()) {
          out.status = result.status();
          return;
        }
        out.steps.push_back({result->microbatch_losses, testing::GradientsByName(stages)});
        for (auto& [s, stage] : stages) {
          for (auto& p : stage->Parameters()) p.mutable_grad().zero_();
        }
      }
      out.status = (*transport)->Barrier(absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

// The whole model in one piece on the same microbatches: per step its microbatch losses (each
// the mean over its counted positions, or with `tokens` its summed loss / the step's count) and
// the gradients of their mean (or sum).
std::vector<StepOutcome> RunWhole(const std::vector<Batch>& steps, bool tokens) {
  auto whole = model::BuildGptStage(Gpt(), 0, kGptLayers);
  EXPECT_TRUE(whole.ok()) << whole.status();
  std::vector<StepOutcome> out;
  for (const Batch& batch : steps) {
    const double n = static_cast<double>(Counted(batch));
    torch::Tensor step_loss = torch::zeros({});
    StepOutcome step;
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      const torch::Tensor logits = (*whole)->ForwardValues({batch.inputs[mb]})[0];
      const torch::Tensor flat = logits.reshape({-1, logits.size(-1)});
      const torch::Tensor y = batch.targets[mb].reshape({-1});
      const torch::Tensor per_token =
          torch::nll_loss(torch::log_softmax(flat, 1), y, {}, at::Reduction::None, kIgnoredTarget);
      const torch::Tensor counted = y.ne(kIgnoredTarget).sum();
      const torch::Tensor loss = tokens ? per_token.sum() / n : per_token.sum() / counted;
      step.losses.push_back(loss.item<double>());
      step_loss = step_loss + loss;
    }
    (tokens ? step_loss : step_loss / kMicrobatches).backward();
    for (auto& [name, p] : (*whole)->NamedParameters()) {
      step.grads[name] = p.grad().clone();
      p.mutable_grad().zero_();
    }
    out.push_back(std::move(step));
  }
  return out;
}

class RaggedShapes : public ::testing::TestWithParam<Case> {};

TEST_P(RaggedShapes, EachMicrobatchsShapeTrainsLikeTheWholeModel) {
  const Case& c = GetParam();
  const std::vector<Batch> steps = TwoSteps();
  const std::vector<RankOutcome> ranks = RunPipeline(c, steps);
  const std::vector<StepOutcome> want = RunWhole(steps, c.tokens);
  for (const RankOutcome& r : ranks) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_EQ(r.steps.size(), steps.size());
  }
  for (size_t k = 0; k < steps.size(); ++k) {
    int with_losses = 0;
    for (const RankOutcome& r : ranks) {
      if (r.steps[k].losses.empty()) continue;
      ++with_losses;
      ASSERT_EQ(r.steps[k].losses.size(), want[k].losses.size());
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        EXPECT_NEAR(r.steps[k].losses[mb], want[k].losses[mb],
                    1e-6 + 1e-5 * std::abs(want[k].losses[mb]))
            << c.kind << " step " << k << " microbatch " << mb;
      }
    }
    EXPECT_EQ(with_losses, 1);
    size_t compared = 0;
    for (const RankOutcome& r : ranks) {
      for (const auto& [name, g] : r.steps[k].grads) {
        ASSERT_EQ(want[k].grads.count(name), 1u) << name;
        EXPECT_TRUE(torch::allclose(g, want[k].grads.at(name), 1e-5, 1e-6))
            << c.kind << " step " << k << " " << name;
        ++compared;
      }
    }
    EXPECT_EQ(compared, want[k].grads.size());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, RaggedShapes,
    ::testing::Values(Case{"GPipe", 1, false, false}, Case{"1F1B", 1, false, true},
                      Case{"1F1B", 1, true, false}, Case{"Interleaved1F1B", 2, false, true},
                      Case{"LoopedBFS", 2, false, false},
                      Case{"InterleavedZeroBubble", 2, false, false},
                      Case{"ZBVZeroBubble", 2, false, true}, Case{"ZBVZeroBubble", 2, true, true},
                      Case{"DualPipeV", 2, false, false},
                      Case{"1F1B", 1, false, true, /*header_ahead=*/true},
                      Case{"ZBVZeroBubble", 2, true, true, /*header_ahead=*/true},
                      Case{"DualPipeV", 2, false, false, /*header_ahead=*/true}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return absl::StrCat(info.param.kind, info.param.recompute ? "_recompute" : "",
                          info.param.tokens ? "_tokens" : "",
                          info.param.header_ahead ? "_header_ahead" : "");
    });

// One rank, the whole model: what the executor accepts as stage 0's input.
absl::Status OneRankStep(bool dynamic_shapes, const torch::Tensor& input,
                         std::optional<TokenNormalization> tokens = std::nullopt,
                         const std::vector<torch::Tensor>* segments = nullptr) {
  auto built = schedule::BuildSchedule(
      schedule::ScheduleConfig{schedule::ScheduleKind::kGPipe, 1, 1, 1}, {});
  if (!built.ok()) return built.status();
  auto stage = model::BuildGptStage(Gpt(), 0, kGptLayers);
  if (!stage.ok()) return stage.status();
  transport::InMemoryStore store;
  auto transport = testing::ConnectThreadRank(store, "one/", 0, 1);
  if (!transport.ok()) return transport.status();
  ExecutorOptions options;
  options.num_microbatches = 1;
  options.stage_to_rank = {0};
  options.loss = LossKind::kCrossEntropy;
  options.dynamic_shapes = dynamic_shapes;
  PipelineExecutor executor(options, transport->get(), {{0, stage->get()}});
  absl::Status agreed = executor.AgreeShapes({TensorMeta{{kRows, kSeq}, torch::kInt64}});
  if (!agreed.ok()) return agreed;
  return executor
      .RunStep(testing::RankActions(*built, 0), {input}, {torch::zeros_like(input)}, tokens,
               segments)
      .status();
}

TEST(RaggedShapesRefused, AMicrobatchLargerThanPlannedIsRefusedNamingTheSize) {
  absl::Status s = OneRankStep(true, torch::zeros({kRows, kSeq + 1}, torch::kInt64));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("input microbatch is Long[2, 11] but Long[2, 10] was planned: "
                             "dimension 1 is larger than planned"),
            std::string::npos)
      << s;
  s = OneRankStep(true, torch::zeros({kRows, kSeq}, torch::kInt32));
  EXPECT_NE(s.message().find("another dtype"), std::string::npos) << s;
  EXPECT_TRUE(OneRankStep(true, torch::zeros({1, 3}, torch::kInt64)).ok());
}

TEST(RaggedShapesRefused, ATokenNormalisedStepNeedsTokensAndSegmentsPerMicrobatch) {
  const torch::Tensor x = torch::zeros({kRows, kSeq}, torch::kInt64);
  absl::Status s = OneRankStep(true, x, TokenNormalization{0, 1.0});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the step's batch counts 0 tokens"), std::string::npos) << s;
  const std::vector<torch::Tensor> two(2, torch::zeros({kRows, kSeq}, torch::kInt64));
  s = OneRankStep(true, x, std::nullopt, &two);
  EXPECT_NE(s.message().find("expected 1 microbatches of segments, got 2"), std::string::npos) << s;
  const std::vector<torch::Tensor> one(1, torch::zeros({kRows, kSeq}, torch::kInt64));
  EXPECT_TRUE(OneRankStep(true, x, TokenNormalization{kRows * kSeq, 1.0}, &one).ok());
}

TEST(RaggedShapesRefused, WithoutDynamicShapesOnlyTheAgreedShapeRuns) {
  const absl::Status s = OneRankStep(false, torch::zeros({kRows, 3}, torch::kInt64));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("was agreed at set-up"), std::string::npos) << s;
  EXPECT_TRUE(OneRankStep(false, torch::zeros({kRows, kSeq}, torch::kInt64)).ok());
}

}  // namespace
}  // namespace stagecoach::runtime::ragged_shapes_test
