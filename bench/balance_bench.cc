// The demo's job before and after the per-rank split (issue 37), on real daemons: two workers on
// loopback run the demo's character GPT under ZBVZeroBubble, alternating in every round
//   before     the demo as it was: 4 blocks, split equal-layers by stage (embed | b0 b1 | b2 b3
//              | norm head: rank 1, holding stages 1 and 2, runs every block);
//   old model  the same model with the split left to its default (profiled, per rank);
//   after      the demo as it is now (scripts/demo_gpt.sh): 8 blocks, the default split.
// Per variant it prints the median step time, samples per second, and per rank the median
// measured bubble, with the bubble the schedule simulator gives the last step's measured action
// costs (GetJob's balance) beside it. Data are synthetic tokens (the demo's fortunes text changes
// nothing a step computes) and there is no validation pass.
//
//   build/bench/balance_bench [--rounds N] [--steps N] [--warmup N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_support.h"
#include "bench/cluster_runs.h"
#include "nlohmann/json.hpp"
#include "tests/support/local_cluster.h"

namespace sc = stagecoach;
using json = nlohmann::json;

namespace {

struct Variant {
  std::string name;
  int layers = 4;
  std::string split;  // the spec's split line
};

std::string Spec(const Variant& v, int steps) {
  return absl::StrCat(
      "name: balance-", v.name,
      "\nmodel: {builtin: {family: gpt, vocab: 96, d_model: 128, layers: ", v.layers,
      ", heads: 4, seq: 64, seed: 1, tie_embeddings: true}}\n", v.split,
      "\nschedule: {kind: ZBVZeroBubble, microbatches: 8}\nplacement: {workers: 2}\n",
      "training: {batch_size: 32, steps: ", steps,
      ", loss: cross_entropy, optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.01},\n",
      "  lr_schedule: {kind: cosine, warmup_steps: 5, min_lr: 0.0003}, grad_clip: {max_norm: "
      "1.0}}\ndata: {kind: synthetic, seed: 1}\n");
}

struct Run {
  std::vector<double> step_seconds;
  std::map<int, std::vector<double>> bubbles;  // by rank
  std::vector<double> simulated;               // of the last traced step, by rank
  std::string split;
};

Run RunOnce(sc::testing::LocalCluster& cluster, const Variant& v, int steps, int warmup) {
  const sc::v1::Job done =
      sc::bench::RunJob(cluster, Spec(v, steps), absl::Minutes(20), "the " + v.name + " job");
  Run run;
  for (const json& event : sc::bench::StepEvents(cluster, done.id(), warmup)) {
    run.step_seconds.push_back(event["step_time_seconds"].get<double>());
    const auto& ratios = event["bubble_ratios"];
    for (size_t r = 0; r < ratios.size(); ++r) {
      run.bubbles[static_cast<int>(r)].push_back(ratios[r].get<double>());
    }
  }
  const sc::v1::Job job = sc::bench::Value("GetJob " + done.id(), cluster.GetJob(done.id()));
  run.split = job.split();
  for (const sc::v1::RankBalance& b : job.balance())
    run.simulated.push_back(b.simulated_bubble_ratio());
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The demo's job before and after the per-rank split"};
  int rounds = 3, steps = 30, warmup = 5;
  app.add_option("--rounds", rounds, "rounds (each runs every variant once, alternating)");
  app.add_option("--steps", steps, "steps of each run");
  app.add_option("--warmup", warmup, "steps left out of each median");
  CLI11_PARSE(app, argc, argv);

  const std::vector<Variant> variants = {
      {"before", 4, "split: {points: {blocks.0: beginning, blocks.2: beginning, norm: beginning}}"},
      {"old-model", 4, "split: {stages: 4}"},
      {"after", 8, "split: {stages: 4}"}};
  sc::testing::ClusterOptions options;
  options.check_lock_order = false;
  options.workers = 2;
  options.log_level = "info";
  auto cluster = sc::bench::Value("starting a cluster", sc::testing::LocalCluster::Start(options));
  std::map<std::string, std::vector<Run>> runs;
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < variants.size(); ++i) {
      const Variant& v = variants[(i + round) % variants.size()];
      runs[v.name].push_back(RunOnce(*cluster, v, steps, warmup));
      std::fprintf(stderr, "round %d: %s done\n", round + 1, v.name.c_str());
    }
  }
  std::printf(
      "%d rounds of %d steps each (medians after %d warm-up steps), 2 workers, "
      "ZBVZeroBubble x 8 microbatches, batch 32\n\n",
      rounds, steps, warmup);
  std::printf("%-10s %-7s %-44s %9s %9s %-22s %-22s\n", "VARIANT", "BLOCKS", "SPLIT", "STEP ms",
              "SAMPLES/s", "BUBBLE r0 (sim)", "BUBBLE r1 (sim)");
  for (const Variant& v : variants) {
    std::vector<double> times;
    std::map<int, std::vector<double>> bubbles;
    std::map<int, std::vector<double>> simulated;
    for (const Run& r : runs[v.name]) {
      times.insert(times.end(), r.step_seconds.begin(), r.step_seconds.end());
      for (const auto& [rank, b] : r.bubbles) {
        bubbles[rank].insert(bubbles[rank].end(), b.begin(), b.end());
      }
      for (size_t rank = 0; rank < r.simulated.size(); ++rank) {
        simulated[static_cast<int>(rank)].push_back(r.simulated[rank]);
      }
    }
    const double step = sc::bench::Median(times);
    std::string split = runs[v.name].front().split;
    if (split.size() > 44) split = split.substr(0, 41) + "...";
    std::printf("%-10s %-7d %-44s %9.1f %9.0f", v.name.c_str(), v.layers, split.c_str(), step * 1e3,
                32 / step);
    for (int rank = 0; rank < 2; ++rank) {
      std::printf(" %-22s", absl::StrFormat(
                                "%.3f (%.3f)", sc::bench::Median(bubbles[rank]),
                                simulated[rank].empty() ? 0.0 : sc::bench::Median(simulated[rank]))
                                .c_str());
    }
    std::printf("\n");
  }
  return 0;
}
