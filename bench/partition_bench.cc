// Times the per-rank split (coordinator/planning/rank_partition.h) as layers and stages grow,
// under the V placement (ZBVZeroBubble, DualPipeV, VHalf, VMin) and the looped one
// (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble), on layer costs of the three kinds the
// planner gives it: alike (equal-layers), a transformer's (a light embedding, equal blocks, a
// tiny norm, a heavier head; equal-params), and noisy profiled times (±20% around equal
// blocks). Prints per case the median time of --repeat runs, whether the search proved its cut
// within its node budget, the largest rank's total over the mean rank total, and the same ratio
// for the stage-balanced cut the planner made before (PartitionBalanced).
//
//   build/bench/partition_bench [--repeat N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "coordinator/planning/planner.h"
#include "coordinator/planning/rank_partition.h"

namespace coord = stagecoach::coordinator;

namespace {

std::vector<int> Placement(bool v, int ranks, int per_rank) {
  std::vector<int> to(ranks * per_rank);
  for (int s = 0; s < static_cast<int>(to.size()); ++s) {
    const int round = s / ranks, k = s % ranks;
    to[s] = v && round % 2 == 1 ? ranks - 1 - k : k;
  }
  return to;
}

std::vector<int64_t> Costs(int kind, int layers, std::mt19937_64& rng) {
  std::vector<int64_t> c(layers, 1);
  if (kind == 1) {
    std::fill(c.begin(), c.end(), 1000);
    c[0] = 80;
    c[layers - 2] = 2;
    c[layers - 1] = 400;
  } else if (kind == 2) {
    std::uniform_int_distribution<int64_t> d(800, 1200);
    for (int64_t& x : c) x = d(rng);
  }
  return c;
}

double Imbalance(const std::vector<int64_t>& costs, const std::vector<int>& to,
                 const std::vector<int>& firsts) {
  const std::vector<int64_t> totals = coord::RankTotals(costs, to, firsts);
  double sum = 0;
  for (int64_t t : totals) sum += static_cast<double>(t);
  return *std::max_element(totals.begin(), totals.end()) / (sum / totals.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Per-rank split: time and balance as layers and stages grow"};
  int repeat = 5;
  int64_t budget = coord::kRankPartitionNodeBudget;
  app.add_option("--repeat", repeat, "runs per case (the median is printed)")
      ->check(CLI::PositiveNumber);
  app.add_option("--budget", budget, "search nodes (default: the planner's)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const char* kinds[] = {"alike", "transformer", "profiled"};
  std::printf("%-8s %-12s %6s %6s %6s %10s %7s %11s %11s\n", "place", "costs", "layers", "ranks",
              "stages", "median ms", "proven", "rank/mean", "stage-bal.");
  std::mt19937_64 rng(1);
  for (bool v : {true, false}) {
    for (int kind = 0; kind < 3; ++kind) {
      for (auto [layers, ranks, per_rank] :
           {std::tuple{10, 2, 2}, std::tuple{34, 4, 2}, std::tuple{66, 8, 2}, std::tuple{130, 8, 2},
            std::tuple{130, 16, 2}, std::tuple{34, 4, 4}, std::tuple{130, 8, 4},
            std::tuple{514, 16, 4}}) {
        if (v && per_rank != 2) continue;
        const std::vector<int64_t> costs = Costs(kind, layers, rng);
        const std::vector<int> to = Placement(v, ranks, per_rank);
        std::vector<double> ms;
        coord::RankPartition last;
        for (int r = 0; r < repeat; ++r) {
          const auto start = std::chrono::steady_clock::now();
          auto got = coord::PartitionPerRank(costs, to, {}, budget);
          ms.push_back(std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - start)
                           .count());
          if (!got.ok()) {
            std::fprintf(stderr, "%s\n", std::string(got.status().message()).c_str());
            return 1;
          }
          last = *got;
        }
        std::sort(ms.begin(), ms.end());
        std::printf("%-8s %-12s %6d %6d %6zu %10.2f %7s %11.3f %11.3f\n", v ? "V" : "looped",
                    kinds[kind], layers, ranks, to.size(), ms[ms.size() / 2],
                    last.proven ? "yes" : "no", Imbalance(costs, to, last.firsts),
                    Imbalance(costs, to, coord::PartitionBalanced(costs, static_cast<int>(to.size()))));
      }
    }
  }
  return 0;
}
