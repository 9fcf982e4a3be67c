// The split policies over ranks (coordinator/planning/split_policies.h) as PlanJob applies
// them: equal-layers counts layers alike in size and weighs them by parameters when they are
// orders of magnitude apart; every policy balances the ranks of a V or looped schedule, not its
// stages; the plan records the policy; and ProfileFlops' estimate, which decides whether a
// default split profiles the model.
#include "coordinator/planning/split_policies.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "coordinator/planning/planner.h"
#include "coordinator/planning/rank_partition.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::split_policies_test {
namespace {

using ::testing::ElementsAre;

spec::JobSpec Parse(const std::string& model, const std::string& split,
                    const std::string& schedule, int workers = 2) {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: ", model, "}\nsplit: ", split,
                   "\nschedule: ", schedule, "\nplacement: {workers: ", workers,
                   "}\ntraining: {batch_size: 16",
                   model.find("gpt") != std::string::npos ? ", loss: cross_entropy" : "",
                   "}\n"),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<int> Firsts(const Plan& plan) {
  std::vector<int> out;
  for (const StagePlan& s : plan.stages) out.push_back(s.first_layer);
  return out;
}

std::vector<int64_t> Counts(const Plan& plan, bool parameters) {
  std::vector<int64_t> costs;
  for (const v1::LayerInfo& l : plan.layers) costs.push_back(parameters ? l.parameters() : 1);
  return RankTotals(costs, plan.stage_to_rank, Firsts(plan));
}

// Ten equal layers under Interleaved1F1B on two ranks (stages 0 and 2 on rank 0, 1 and 3 on
// rank 1): five a rank.
TEST(SplitPolicies, EqualLayersCountsLayersAlikeInSizeOverTheRanks) {
  const spec::JobSpec spec = Parse("{family: mlp, sizes: [8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]}",
                                   "{stages: 4, policy: equal-layers}",
                                   "{kind: Interleaved1F1B, microbatches: 4}");
  auto plan = PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->split, "equal-layers");
  EXPECT_THAT(plan->stage_to_rank, ElementsAre(0, 1, 0, 1));  // looped
  EXPECT_THAT(Counts(*plan, false), ElementsAre(5, 5));
}

// A GPT's norm has 2 x d_model parameters, a block about 12 x d_model^2: counted alike, a V's
// rank 0 would hold the embedding, norm and head and rank 1 all four blocks.
TEST(SplitPolicies, EqualLayersWeighsLayersOrdersOfMagnitudeApartByTheirParameters) {
  const spec::JobSpec spec =
      Parse("{family: gpt, vocab: 64, d_model: 32, layers: 4, heads: 4, seq: 16}",
            "{stages: 4, policy: equal-layers}", "{kind: ZBVZeroBubble, microbatches: 4}");
  auto plan = PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->stage_to_rank, ElementsAre(0, 1, 1, 0));
  // Each rank two of the four blocks.
  std::vector<int> blocks(2, 0);
  for (const StagePlan& st : plan->stages) {
    for (int l = st.first_layer; l < st.end_layer; ++l) {
      if (plan->layers[l].name().rfind("blocks.", 0) == 0) ++blocks[plan->stage_to_rank[st.stage]];
    }
  }
  EXPECT_THAT(blocks, ElementsAre(2, 2));
}

// Layers of very different sizes under DualPipeV: equal-params balances the ranks' parameters
// as well as any cut can (checked against every cut), where the stage-balanced cut does not.
TEST(SplitPolicies, EqualParamsBalancesTheRanksOfAV) {
  const spec::JobSpec spec =
      Parse("{family: mlp, sizes: [64, 8, 8, 8, 64, 64, 8, 8, 8]}",
            "{stages: 4, policy: equal-params}", "{kind: DualPipeV, microbatches: 4}");
  auto plan = PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int64_t> params;
  for (const v1::LayerInfo& l : plan->layers) params.push_back(l.parameters());
  const std::vector<int64_t> totals = Counts(*plan, true);
  int64_t best = INT64_MAX;
  const int n = static_cast<int>(params.size());
  for (int a = 1; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      for (int c = b + 1; c < n; ++c) {
        const std::vector<int64_t> t = RankTotals(params, plan->stage_to_rank, {0, a, b, c});
        best = std::min(best, *std::max_element(t.begin(), t.end()));
      }
    }
  }
  EXPECT_EQ(*std::max_element(totals.begin(), totals.end()), best);
  const std::vector<int64_t> by_stage =
      RankTotals(params, plan->stage_to_rank, PartitionBalanced(params, 4));
  EXPECT_GT(*std::max_element(by_stage.begin(), by_stage.end()), best);
}

TEST(SplitPolicies, FewerFirstLastCountsTheEndsTwiceOverTheRanks) {
  const spec::JobSpec spec = Parse("{family: mlp, sizes: [8, 8, 8, 8, 8, 8, 8, 8, 8]}",
                                   "{stages: 4, policy: fewer-first-last}",
                                   "{kind: ZBVZeroBubble, microbatches: 4}");
  auto plan = PlanJob(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Eight layers, the first and last counting two: ten in all, five a rank.
  std::vector<int64_t> costs(8, 1);
  costs.front() = costs.back() = 2;
  EXPECT_THAT(RankTotals(costs, plan->stage_to_rank, Firsts(*plan)), ElementsAre(5, 5));
}

// Every cut of `costs` into stage_to_rank.size() stages: the smallest largest rank total.
int64_t BestLargestRank(const std::vector<int64_t>& costs, const std::vector<int>& to) {
  const int n = static_cast<int>(costs.size()), stages = static_cast<int>(to.size());
  int64_t best = INT64_MAX;
  std::vector<int> firsts = {0};
  std::function<void()> walk = [&] {
    if (static_cast<int>(firsts.size()) == stages) {
      const std::vector<int64_t> t = RankTotals(costs, to, firsts);
      best = std::min(best, *std::max_element(t.begin(), t.end()));
      return;
    }
    const int left = stages - static_cast<int>(firsts.size());
    for (int f = firsts.back() + 1; f <= n - left; ++f) {
      firsts.push_back(f);
      walk();
      firsts.pop_back();
    }
  };
  walk();
  return best;
}

// For a GPT and an MLP, under ZBVZeroBubble, DualPipeV, Interleaved1F1B and 1F1B on 2 and 4
// ranks, each policy's ranks are as balanced as any cut of the layers into the schedule's
// stages can make them, by the quantity the policy balances (spec.md): equal-layers one a layer
// (parameters for the GPT, whose norm is orders of magnitude below a block), equal-params the
// parameters, profiled the measured forward + backward nanoseconds, fewer-first-last one a
// layer with the ends counting two.
TEST(SplitPolicies, EveryPolicyIsAsBalancedOverTheRanksAsAnyCut) {
  const std::vector<std::pair<std::string, std::string>> models = {
      {"gpt", "{family: gpt, vocab: 64, d_model: 32, layers: 6, heads: 4, seq: 16}"},
      {"mlp", "{family: mlp, sizes: [16, 64, 8, 32, 32, 128, 8, 8, 64, 16, 16, 48, 4]}"}};
  for (const auto& [family, model] : models) {
    for (const std::string kind : {"ZBVZeroBubble", "DualPipeV", "Interleaved1F1B", "1F1B"}) {
      for (int ranks : {2, 4}) {
        const int stages = kind == "1F1B" ? ranks : 2 * ranks;
        for (const std::string policy :
             {"equal-layers", "equal-params", "profiled", "fewer-first-last"}) {
          SCOPED_TRACE(absl::StrCat(family, " ", kind, " on ", ranks, " ranks, ", policy));
          const spec::JobSpec spec =
              Parse(model, absl::StrCat("{stages: ", stages, ", policy: ", policy, "}"),
                    absl::StrCat("{kind: ", kind, ", microbatches: 8}"), ranks);
          std::vector<v1::LayerInfo> layers = BuiltinLayers(*spec.model.builtin);
          std::vector<int64_t> costs;
          for (size_t l = 0; l < layers.size(); ++l) {
            // Measured times unlike the parameters: every third layer slow.
            const double forward = 1e-4 * (1 + (l % 3 == 0 ? 5 : 0)) + 1e-9 * layers[l].parameters();
            layers[l].set_forward_seconds(forward);
            layers[l].set_backward_seconds(2 * forward);
            if (policy == "equal-params" || (policy == "equal-layers" && family == "gpt")) {
              costs.push_back(layers[l].parameters());
            } else if (policy == "profiled") {
              costs.push_back(std::llround(
                  (layers[l].forward_seconds() + layers[l].backward_seconds()) * 1e9));
            } else {
              costs.push_back(policy == "fewer-first-last" &&
                                      (l == 0 || l + 1 == layers.size())
                                  ? 2
                                  : 1);
            }
          }
          auto plan = PlanJob(spec, layers);
          ASSERT_TRUE(plan.ok()) << plan.status();
          ASSERT_EQ(plan->num_ranks, ranks);
          const std::vector<int64_t> totals = RankTotals(costs, plan->stage_to_rank, Firsts(*plan));
          EXPECT_EQ(*std::max_element(totals.begin(), totals.end()),
                    BestLargestRank(costs, plan->stage_to_rank));
        }
      }
    }
  }
}

TEST(ProfileFlops, EstimatesAProfileOfABuiltinModel) {
  // An MLP of 8 -> 64 -> 8 (1,096 parameters), 16 rows in 4 microbatches of 4: forward
  // 2 x 1,096 x 4 = 8,768 FLOPs, 30 of them.
  spec::JobSpec mlp =
      Parse("{family: mlp, sizes: [8, 64, 8]}", "{stages: 2}", "{kind: 1F1B, microbatches: 4}");
  EXPECT_DOUBLE_EQ(ProfileFlops(mlp), 30 * 2 * 1096 * 4);
  // The demo's GPT is cheap to profile; one 16 times as wide on longer rows is not.
  spec::JobSpec demo = Parse("{family: gpt, vocab: 100, d_model: 128, layers: 8, heads: 4, seq: 64}",
                             "{stages: 4}", "{kind: ZBVZeroBubble, microbatches: 8}");
  EXPECT_LT(ProfileFlops(demo), kCheapProfileFlops);
  spec::JobSpec wide = Parse("{family: gpt, vocab: 100, d_model: 2048, layers: 8, heads: 4, seq: 64}",
                             "{stages: 4}", "{kind: ZBVZeroBubble, microbatches: 8}");
  EXPECT_GT(ProfileFlops(wide), kCheapProfileFlops);
}

}  // namespace
}  // namespace stagecoach::coordinator::split_policies_test
