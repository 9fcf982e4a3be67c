// The plan search (coordinator/planning/plan_search.h) over synthetic profiles: what it tries, how
// it scales a profile to other microbatch sizes, and what it chooses — a zero-bubble schedule
// without a limit, a low-memory one under a tight limit, no split backward when I + W cost far
// more than B, a clear refusal naming the smallest peak when nothing fits.
#include "coordinator/planning/plan_search.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::plan_search_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

spec::JobSpec Parse(const std::string& schedule, const std::string& extra = "",
                    const std::string& placement = "{workers: 4}",
                    const std::string& training = "{batch_size: 256}") {
  auto spec = spec::ParseJobSpec(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [64, 64, 64, 64, 64, 64, 64, "
                   "64, 64, 64, 64, 64, 64, 64, 64, 64, 8]}}\n",
                   extra, "schedule: ", schedule, "\nplacement: ", placement,
                   "\ntraining: ", training, "\n"),
      "t");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// 16 layers profiled on `rows`-row microbatches: 4,160 parameters each, forward 1 ms, backward
// 2 ms (I and W `split_factor` ms each), per row 4 KiB kept and 256 bytes out; everything
// proportional to the rows (64 rows: the numbers above).
LayerProfile Profile(int64_t rows, double split_factor = 1.0) {
  LayerProfile p;
  p.rows = rows;
  const double scale = static_cast<double>(rows) / 64;
  for (int l = 0; l < 16; ++l) {
    v1::LayerInfo& layer = p.layers.emplace_back();
    layer.set_name(absl::StrCat(l));
    layer.set_parameters(4160);
    layer.set_forward_seconds(1e-3 * scale);
    layer.set_backward_seconds(2e-3 * scale);
    layer.set_backward_input_seconds(split_factor * 1e-3 * scale);
    layer.set_backward_weight_seconds(split_factor * 1e-3 * scale);
    layer.set_activation_bytes(static_cast<int64_t>(4096 * rows));
    layer.set_output_bytes(static_cast<int64_t>(256 * rows));
    layer.set_backward_transient_bytes(static_cast<int64_t>(512 * rows));
  }
  return p;
}

const std::set<std::string>& SplitBackwardSchedules() {
  static const auto* kinds = new std::set<std::string>{"InterleavedZeroBubble", "ZBVZeroBubble",
                                                       "DualPipeV", "VHalf", "VMin"};
  return *kinds;
}

SearchResult MustSearch(const spec::JobSpec& spec, const std::vector<LayerProfile>& profiles,
                        int64_t limit = 0) {
  SearchOptions options;
  options.memory_limit_bytes = limit;
  auto result = SearchPlans(spec, profiles, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : SearchResult{};
}

TEST(PlanSearch, MicrobatchCountsAreTheBatchsDivisorsFromWorkersToEightTimesWorkers) {
  EXPECT_THAT(SearchMicrobatchCounts(Parse("{kind: auto}")), ElementsAre(4, 8, 16, 32));
  EXPECT_THAT(SearchMicrobatchCounts(Parse("{kind: auto, microbatches: 8}")), ElementsAre(8));
  // 256 rows over 2 replicas: 128 each.
  EXPECT_THAT(SearchMicrobatchCounts(Parse("{kind: auto}", "", "{workers: 8, replicas: 2}")),
              ElementsAre(8, 16, 32, 64));
}

TEST(PlanSearch, PoliciesAreTheSpecsOrAllOfThem) {
  EXPECT_THAT(SearchSplitPolicies(Parse("{kind: auto}", "split: {policy: memory}\n")),
              ElementsAre("memory"));
  EXPECT_EQ(SearchSplitPolicies(Parse("{kind: auto}")).size(), 5u);
  EXPECT_THAT(SearchSplitPolicies(
                  Parse("{kind: auto}", "split: {points: {\"4\": beginning}}\n", "{workers: 2}")),
              ElementsAre("points"));
}

TEST(PlanSearch, LayersForRowsFollowsTheLineThroughTwoProfiles) {
  LayerProfile small = Profile(16), large = Profile(64);
  // A fixed 100 us per forward on top of the proportional part.
  for (LayerProfile* p : {&small, &large}) {
    for (v1::LayerInfo& l : p->layers) l.set_forward_seconds(l.forward_seconds() + 1e-4);
  }
  const std::vector<v1::LayerInfo> mid = LayersForRows({large, small}, 32);
  EXPECT_NEAR(mid[0].forward_seconds(), 0.5e-3 + 1e-4, 1e-12);
  EXPECT_EQ(mid[0].activation_bytes(), 4096 * 32);
  EXPECT_EQ(mid[0].parameters(), 4160);
  // One profile: proportional to the rows.
  const std::vector<v1::LayerInfo> half = LayersForRows({Profile(64)}, 32);
  EXPECT_NEAR(half[3].backward_seconds(), 1e-3, 1e-12);
  EXPECT_EQ(half[3].output_bytes(), 256 * 32);
  // A line that would fall with the rows (noise) is not followed: the nearer profile scaled.
  LayerProfile noisy = Profile(16);
  noisy.layers[0].set_forward_seconds(5e-3);
  EXPECT_NEAR(LayersForRows({noisy, Profile(64)}, 48)[0].forward_seconds(), 0.75e-3, 1e-12);
}

TEST(PlanSearch, WithoutALimitTheFastestIsAZeroBubbleSchedule) {
  const SearchResult result = MustSearch(Parse("{kind: auto}"), {Profile(64), Profile(8)});
  ASSERT_FALSE(result.candidates.empty());
  EXPECT_EQ(result.fitting, static_cast<int>(result.candidates.size()));
  for (size_t i = 1; i < result.candidates.size(); ++i) {
    EXPECT_LE(result.candidates[i - 1].step_seconds(), result.candidates[i].step_seconds());
  }
  std::set<std::string> schedules;
  for (const v1::PlanCandidate& c : result.candidates) schedules.insert(c.schedule());
  EXPECT_EQ(schedules.size(), 9u);  // every training schedule
  const v1::PlanCandidate& best = result.candidates.front();
  EXPECT_THAT(best.schedule(),
              ::testing::AnyOf("ZBVZeroBubble", "InterleavedZeroBubble", "DualPipeV"))
      << DescribeCandidate(best);
  EXPECT_GT(best.max_peak_bytes(), 0);
  EXPECT_EQ(best.rank_peak_bytes_size(), 4);
  auto choice = ChoosePlan(result);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->chosen().schedule(), best.schedule());
  EXPECT_TRUE(choice->has_runner_up());
  EXPECT_EQ(choice->candidates(), static_cast<int>(result.candidates.size()));
}

TEST(PlanSearch, ATightLimitChoosesALowMemoryPlan) {
  const spec::JobSpec spec = Parse("{kind: auto, microbatches: 16}");
  const SearchResult free = MustSearch(spec, {Profile(16)});
  int64_t smallest = free.candidates.front().max_peak_bytes();
  for (const v1::PlanCandidate& c : free.candidates) {
    smallest = std::min(smallest, c.max_peak_bytes());
  }
  const int64_t fastest_peak = free.candidates.front().max_peak_bytes();
  ASSERT_LT(smallest, fastest_peak);
  // Just above the smallest peak: only the leanest plans fit.
  const int64_t limit = smallest + (fastest_peak - smallest) / 10;
  const SearchResult tight = MustSearch(spec, {Profile(16)}, limit);
  ASSERT_GT(tight.fitting, 0);
  EXPECT_LT(tight.fitting, static_cast<int>(tight.candidates.size()));
  const v1::PlanCandidate& chosen = tight.candidates.front();
  EXPECT_TRUE(chosen.fits());
  EXPECT_LE(chosen.max_peak_bytes(), limit);
  EXPECT_LT(chosen.max_peak_bytes(), fastest_peak);
  EXPECT_GE(chosen.step_seconds(), free.candidates.front().step_seconds());
  for (int i = tight.fitting; i < static_cast<int>(tight.candidates.size()); ++i) {
    EXPECT_FALSE(tight.candidates[i].fits());
    EXPECT_GT(tight.candidates[i].max_peak_bytes(), limit);
  }
}

TEST(PlanSearch, NothingFitsNamesTheLimitAndTheSmallestPeak) {
  const SearchResult result =
      MustSearch(Parse("{kind: auto, microbatches: 8}"), {Profile(32)}, 1000);
  EXPECT_EQ(result.fitting, 0);
  auto choice = ChoosePlan(result);
  ASSERT_FALSE(choice.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(choice.status()));
  EXPECT_THAT(std::string(choice.status().message()),
              HasSubstr("placement.memory_limit: no plan fits 1000 B per worker: the smallest "
                        "predicted peak of the"));
}

TEST(PlanSearch, ASlowSplitBackwardIsAvoided) {
  // I and W each cost 3 ms against B's 2 ms: a split backward makes every step slower.
  const SearchResult result =
      MustSearch(Parse("{kind: auto}"), {Profile(64, 3.0), Profile(8, 3.0)});
  ASSERT_FALSE(result.candidates.empty());
  EXPECT_EQ(SplitBackwardSchedules().count(result.candidates.front().schedule()), 0u)
      << DescribeCandidate(result.candidates.front());
}

TEST(PlanSearch, ANamedScheduleSearchesOnlyItsVariants) {
  const SearchResult result = MustSearch(Parse("{kind: Interleaved1F1B}"), {Profile(64)});
  ASSERT_FALSE(result.candidates.empty());
  std::set<int> stages_per_rank;
  for (const v1::PlanCandidate& c : result.candidates) {
    EXPECT_EQ(c.schedule(), "Interleaved1F1B");
    stages_per_rank.insert(c.stages_per_rank());
  }
  EXPECT_THAT(stages_per_rank, ElementsAre(2, 3, 4));
}

TEST(PlanSearch, RefusesWhatCannotBeSearched) {
  SearchOptions options;
  auto no_workers =
      SearchPlans(Parse("{kind: auto}", "split: {stages: 4}\n", "{}"), {Profile(64)}, options);
  EXPECT_THAT(std::string(no_workers.status().message()), HasSubstr("placement.workers: required"));
  auto inference = SearchPlans(Parse("{kind: ForwardOnly}"), {Profile(64)}, options);
  EXPECT_THAT(std::string(inference.status().message()),
              HasSubstr("schedule.kind: plans are searched for training schedules only"));
  auto file = SearchPlans(Parse("{csv: my.csv, microbatches: 4}"), {Profile(64)}, options);
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("schedule.csv: a schedule file is one plan already"));
  LayerProfile unsized = Profile(64);
  for (v1::LayerInfo& l : unsized.layers) {
    l.set_activation_bytes(0);
    l.set_output_bytes(0);
  }
  options.memory_limit_bytes = 1 << 30;
  auto cuda = SearchPlans(Parse("{kind: auto}"), {unsized}, options);
  EXPECT_THAT(std::string(cuda.status().message()),
              HasSubstr("placement.memory_limit: the model's profile carries no measured sizes"));
}

// placement.shard: auto tries every level per candidate and keeps the lowest that fits: none
// without a limit; under a limit no unsharded plan meets, a sharded one. 4 replicas with AdamW,
// whose two moments ZeRO divides.
TEST(PlanSearch, ShardAutoTakesTheLowestLevelThatFits) {
  const std::string training = "{batch_size: 256, optimizer: {kind: adamw}}";
  const spec::JobSpec spec = Parse("{kind: auto, microbatches: 16}", "",
                                   "{workers: 4, replicas: 4, shard: auto}", training);
  const SearchResult free = MustSearch(spec, {Profile(16)});
  for (const v1::PlanCandidate& c : free.candidates) EXPECT_EQ(c.shard(), "none");
  EXPECT_THAT(DescribeCandidate(free.candidates.front()), HasSubstr(", shard none"));
  int64_t smallest = free.candidates.front().max_peak_bytes();
  for (const v1::PlanCandidate& c : free.candidates) {
    smallest = std::min(smallest, c.max_peak_bytes());
  }
  const SearchResult tight = MustSearch(spec, {Profile(16)}, smallest - 1);
  ASSERT_GT(tight.fitting, 0) << "sharding lowers the smallest peak";
  for (int i = 0; i < tight.fitting; ++i) {
    EXPECT_NE(tight.candidates[i].shard(), "none");
    EXPECT_TRUE(tight.candidates[i].fits());
  }
  // The level chosen is the lowest that fits: one level lower does not, for the same plan.
  const v1::PlanCandidate& chosen = tight.candidates.front();
  const std::vector<std::string> levels = {"none", "optimizer", "gradients", "parameters"};
  const auto at = std::find(levels.begin(), levels.end(), chosen.shard());
  ASSERT_NE(at, levels.end());
  ASSERT_NE(at, levels.begin());
  const spec::JobSpec lower =
      Parse(absl::StrCat("{kind: ", chosen.schedule(), ", microbatches: 16}"),
            absl::StrCat("split: {stages: ", chosen.num_stages(),
                         ", policy: ", chosen.split_policy(), "}\n"),
            absl::StrCat("{workers: 4, replicas: 4, shard: ", *(at - 1), "}"), training);
  const SearchResult below = MustSearch(lower, {Profile(16)}, smallest - 1);
  ASSERT_EQ(below.candidates.size(), 1u);
  EXPECT_FALSE(below.candidates.front().fits());
  const spec::SpecOverrides o = CandidateOverrides(chosen);
  EXPECT_EQ(o.set.back(), (std::pair<std::string, std::string>{"placement.shard", chosen.shard()}));
}

TEST(PlanSearch, CandidateOverridesSetTheChosenFields) {
  v1::PlanCandidate c;
  c.set_schedule("VHalf");
  c.set_num_stages(8);
  c.set_microbatches(16);
  c.set_split_policy("memory");
  const spec::SpecOverrides o = CandidateOverrides(c);
  EXPECT_THAT(o.set, ElementsAre(std::pair<std::string, std::string>{"schedule.kind", "VHalf"},
                                 std::pair<std::string, std::string>{"schedule.microbatches", "16"},
                                 std::pair<std::string, std::string>{"split.stages", "8"},
                                 std::pair<std::string, std::string>{"split.policy", "memory"}));
}

}  // namespace
}  // namespace stagecoach::coordinator::plan_search_test
