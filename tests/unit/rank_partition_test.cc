// PartitionPerRank (coordinator/planning/rank_partition.h) against a brute force over every cut
// of small models, under the placements the schedules use (V, looped, one stage per rank) and
// arbitrary ones; the demo's GPT under ZBVZeroBubble; the one-stage-per-rank case against
// PartitionBalanced; a model too large to prove, whose cut is still within one layer of the
// mean; and bad arguments.
#include "coordinator/planning/rank_partition.h"

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/planning/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::coordinator::rank_partition_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// V placement of 2p stages on p ranks: stage s on rank s, stage 2p-1-s on rank s.
std::vector<int> VPlacement(int ranks) {
  std::vector<int> to(2 * ranks);
  for (int s = 0; s < ranks; ++s) to[s] = to[2 * ranks - 1 - s] = s;
  return to;
}

// Looped placement of v x p stages: stage s on rank s mod p.
std::vector<int> LoopPlacement(int ranks, int per_rank) {
  std::vector<int> to(ranks * per_rank);
  for (size_t s = 0; s < to.size(); ++s) to[s] = static_cast<int>(s) % ranks;
  return to;
}

// The best cut by the contract's order, found by trying every one: the smallest largest rank,
// then the smallest largest stage, then the boundaries that come first (lexicographically).
struct Best {
  std::tuple<int64_t, int64_t, std::vector<int>> key{std::numeric_limits<int64_t>::max(), 0, {}};
};

void Enumerate(const std::vector<int64_t>& costs, const std::vector<int>& to,
               std::vector<int>& firsts, Best& best) {
  const int n = static_cast<int>(costs.size());
  const int stages = static_cast<int>(to.size());
  const int s = static_cast<int>(firsts.size());
  if (s == stages) {
    std::vector<int64_t> totals = RankTotals(costs, to, firsts);
    int64_t largest_stage = 0;
    for (int k = 0; k < stages; ++k) {
      const int end = k + 1 < stages ? firsts[k + 1] : n;
      int64_t c = 0;
      for (int l = firsts[k]; l < end; ++l) c += costs[l];
      largest_stage = std::max(largest_stage, c);
    }
    auto key = std::make_tuple(*std::max_element(totals.begin(), totals.end()), largest_stage,
                               firsts);
    if (key < best.key) best.key = key;
    return;
  }
  const int from = s == 0 ? 0 : firsts.back() + 1;
  const int to_layer = s == 0 ? 0 : n - (stages - s);
  for (int f = from; f <= to_layer; ++f) {
    firsts.push_back(f);
    Enumerate(costs, to, firsts, best);
    firsts.pop_back();
  }
}

std::vector<int> BruteForce(const std::vector<int64_t>& costs, const std::vector<int>& to) {
  Best best;
  std::vector<int> firsts;
  Enumerate(costs, to, firsts, best);
  return std::get<2>(best.key);
}

std::string Describe(const std::vector<int64_t>& costs, const std::vector<int>& to) {
  return absl::StrCat("costs [", absl::StrJoin(costs, ", "), "], stage_to_rank [",
                      absl::StrJoin(to, ", "), "]");
}

// The largest rank and the largest stage of `firsts`.
std::pair<int64_t, int64_t> Largest(const std::vector<int64_t>& costs, const std::vector<int>& to,
                                    const std::vector<int>& firsts) {
  const std::vector<int64_t> totals = RankTotals(costs, to, firsts);
  int64_t largest_stage = 0;
  for (size_t s = 0; s < firsts.size(); ++s) {
    const int end = s + 1 < firsts.size() ? firsts[s + 1] : static_cast<int>(costs.size());
    int64_t c = 0;
    for (int l = firsts[s]; l < end; ++l) c += costs[l];
    largest_stage = std::max(largest_stage, c);
  }
  return {*std::max_element(totals.begin(), totals.end()), largest_stage};
}

// Where every rank holds one stage, or one rank all of them, the contract's third choice is
// PartitionBalanced's (its prefixes balanced in turn); the first two are the brute force's.
// Elsewhere the cut is the brute force's.
void ExpectBruteForceCut(const std::vector<int64_t>& costs, const std::vector<int>& to) {
  auto got = PartitionPerRank(costs, to, {});
  ASSERT_TRUE(got.ok()) << got.status() << " for " << Describe(costs, to);
  const std::vector<int> best = BruteForce(costs, to);
  const std::set<int> ranks(to.begin(), to.end());
  if (ranks.size() == 1 || ranks.size() == to.size()) {
    EXPECT_EQ(Largest(costs, to, got->firsts), Largest(costs, to, best)) << Describe(costs, to);
    EXPECT_EQ(got->firsts, PartitionBalanced(costs, static_cast<int>(to.size())));
  } else {
    EXPECT_EQ(got->firsts, best) << Describe(costs, to);
  }
  EXPECT_EQ(std::make_pair(got->largest_rank, got->largest_stage), Largest(costs, to, best));
  EXPECT_TRUE(got->proven) << Describe(costs, to);
}

// Costs of three kinds: alike (unit layers), a transformer's (a light first layer, heavy blocks,
// a tiny norm, a head), and random over two orders of magnitude.
std::vector<int64_t> RandomCosts(std::mt19937_64& rng, int n, int kind) {
  std::vector<int64_t> costs(n, 1);
  if (kind == 1) {
    for (int l = 0; l < n; ++l) costs[l] = 120;
    costs[0] = 20;
    if (n >= 3) costs[n - 2] = 1;
    costs[n - 1] = 60;
  } else if (kind == 2) {
    std::uniform_int_distribution<int64_t> d(1, 100);
    for (int64_t& c : costs) c = d(rng);
  }
  return costs;
}

TEST(PartitionPerRank, EqualsTheBruteForceUnderVPlacements) {
  std::mt19937_64 rng(1);
  for (int ranks : {2, 3}) {
    for (int n = 2 * ranks; n <= 11; ++n) {
      for (int kind = 0; kind < 3; ++kind) {
        ExpectBruteForceCut(RandomCosts(rng, n, kind), VPlacement(ranks));
      }
    }
  }
}

TEST(PartitionPerRank, EqualsTheBruteForceUnderLoopedPlacements) {
  std::mt19937_64 rng(2);
  for (auto [ranks, per_rank] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 2}}) {
    for (int n = ranks * per_rank; n <= 11; ++n) {
      for (int kind = 0; kind < 3; ++kind) {
        ExpectBruteForceCut(RandomCosts(rng, n, kind), LoopPlacement(ranks, per_rank));
      }
    }
  }
}

TEST(PartitionPerRank, EqualsTheBruteForceUnderArbitraryPlacements) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 150; ++trial) {
    const int n = 3 + static_cast<int>(rng() % 9);
    const int stages = 2 + static_cast<int>(rng() % std::min(5, n - 1));
    const int ranks = 1 + static_cast<int>(rng() % stages);
    std::vector<int> to(stages);
    for (int s = 0; s < stages; ++s) to[s] = s < ranks ? s : static_cast<int>(rng() % ranks);
    ExpectBruteForceCut(RandomCosts(rng, n, static_cast<int>(rng() % 3)), to);
  }
}

TEST(PartitionPerRank, OneStagePerRankIsTheStageBalancedCut) {
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<int64_t> costs = RandomCosts(rng, 10, 2);
    auto got = PartitionPerRank(costs, {0, 1, 2, 3}, {});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->firsts, PartitionBalanced(costs, 4)) << Describe(costs, {0, 1, 2, 3});
  }
}

// A GPT under ZBVZeroBubble on two ranks, by compute: a light embedding, six equal blocks, a
// tiny norm and head. Balancing the stages (at most two blocks each) gives rank 1 the two middle
// stages, four blocks, against rank 0's two; balancing the ranks gives each three.
TEST(PartitionPerRank, GptUnderAVBalancesTheRanksNotTheStages) {
  const std::vector<int64_t> costs = {1, 10, 10, 10, 10, 10, 10, 1, 1};
  const std::vector<int> to = VPlacement(2);  // stages 0 and 3 on rank 0, 1 and 2 on rank 1
  const std::vector<int64_t> by_stage = RankTotals(costs, to, PartitionBalanced(costs, 4));
  EXPECT_THAT(by_stage, ElementsAre(23, 40));
  auto got = PartitionPerRank(costs, to, {});
  ASSERT_TRUE(got.ok());
  // Three blocks each, the norm with rank 1's and the embedding and head with rank 0's: 32 and
  // 31, the best any cut can do (63 in all, blocks indivisible).
  EXPECT_THAT(RankTotals(costs, to, got->firsts), ElementsAre(32, 31));
  EXPECT_EQ(got->largest_rank, 32);
}

// Too many cuts to prove within the budget: the cut is still valid and within one layer of the
// mean over the ranks.
TEST(PartitionPerRank, ALargeModelGetsAValidCutWithinOneLayerOfTheMean) {
  std::mt19937_64 rng(5);
  std::vector<int64_t> costs(3000);
  std::uniform_int_distribution<int64_t> d(1000, 100000);
  for (int64_t& c : costs) c = d(rng);
  const std::vector<int> to = LoopPlacement(8, 4);
  auto got = PartitionPerRank(costs, to, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->firsts.size(), 32u);
  EXPECT_EQ(got->firsts[0], 0);
  for (size_t s = 1; s < got->firsts.size(); ++s) EXPECT_LT(got->firsts[s - 1], got->firsts[s]);
  EXPECT_LT(got->firsts.back(), 3000);
  int64_t total = 0;
  for (int64_t c : costs) total += c;
  const std::vector<int64_t> totals = RankTotals(costs, to, got->firsts);
  EXPECT_EQ(*std::max_element(totals.begin(), totals.end()), got->largest_rank);
  EXPECT_LE(got->largest_rank, (total + 7) / 8 + 100000);
}

TEST(PartitionPerRank, RefusesMoreStagesThanLayers) {
  auto got = PartitionPerRank({1, 1, 1}, VPlacement(2), {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("3 layers into 4"));
}

}  // namespace
}  // namespace stagecoach::coordinator::rank_partition_test
