// ZeRO's shard levels on real daemons (issue 41): 2 replicas x 2 workers on loopback train a
// wide MLP whose stage parameters are the largest term (6 layers, 64-W-W-W-W-W-64 in stages of
// equal layers, 1F1B or a schedule of 2 stages per worker, AdamW, a small batch), once per
// placement.shard level, alternating the levels in every round. Per level it prints the median
// step time and its ratio to `none`, and per rank the peak tensor bytes its worker process held
// in a step (ReportStepRequest.peak_live_bytes, the counting allocator), what it holds between
// steps for parameters and gradients, the bytes its data-parallel collectives sent per step,
// and the hidden fraction of its all-gathers (shard: parameters; 1 - compute's wait / the
// gathers' span). Byte figures are of each rank's latest step in the last round (they do not
// vary from step to step); the hidden fraction is the median over rounds.
//
//   build/bench/shard_bench [--rounds N] [--steps N] [--warmup N] [--width N]
//                           [--unshard step|stage] [--schedule 1F1B|ZBVZeroBubble|...]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_support.h"
#include "bench/cluster_runs.h"
#include "common/util/byte_size.h"
#include "nlohmann/json.hpp"
#include "tests/support/local_cluster.h"

namespace sc = stagecoach;
using json = nlohmann::json;

namespace {

constexpr int kReplicas = 2;
constexpr int kWorkers = 2;
const char* const kLevels[] = {"none", "optimizer", "gradients", "parameters"};

struct Options {
  int rounds = 3;
  int steps = 12;
  int warmup = 3;
  int width = 1024;
  std::string unshard = "step";
  std::string schedule = "1F1B";  // or a schedule of 2 stages per worker (4 stages)
};

std::string Spec(const Options& o, const std::string& level) {
  const std::string w = absl::StrCat(o.width);
  return absl::StrCat(
      "name: shard-", level, "\nmodel: {builtin: {family: mlp, sizes: [64, ", w, ", ", w, ", ", w,
      ", ", w, ", ", w, ", 64], seed: 1}}\n",
      // The same split at every level (a memory-based default would move with the level).
      "split: {stages: ", o.schedule == "1F1B" ? 2 : 4,
      ", policy: equal-layers}\nschedule: {kind: ", o.schedule, ", microbatches: 4}\n",
      "placement: {workers: ", kWorkers, ", replicas: ", kReplicas, ", shard: ", level,
      level == "parameters" ? absl::StrCat(", unshard: ", o.unshard) : std::string(), "}\n",
      "training: {batch_size: 16, steps: ", o.steps,
      ", loss: mse, optimizer: {kind: adamw, lr: 0.001, weight_decay: 0.01}}\n",
      "data: {kind: synthetic, seed: 1}\n");
}

struct RankFigures {
  int64_t peak = 0;
  int64_t held_parameters = 0;
  int64_t held_gradients = 0;
  int64_t sent_per_step = 0;
  double gather_hidden = 0;
};

struct Run {
  std::vector<double> step_seconds;
  std::vector<RankFigures> ranks;  // by task (replica-major)
};

Run RunOnce(sc::testing::LocalCluster& cluster, const Options& o, const std::string& level) {
  const sc::v1::Job done =
      sc::bench::RunJob(cluster, Spec(o, level), absl::Minutes(20), "the " + level + " job");
  Run run;
  for (const json& event : sc::bench::StepEvents(cluster, done.id(), o.warmup)) {
    run.step_seconds.push_back(event["step_time_seconds"].get<double>());
  }
  const sc::v1::Job job = sc::bench::Value("GetJob " + done.id(), cluster.GetJob(done.id()));
  for (const sc::v1::RankStatus& rank : job.ranks()) {
    run.ranks.push_back({rank.peak_live_bytes(), rank.held_parameter_bytes(),
                         rank.held_gradient_bytes(), rank.reduction_bytes_sent() / o.steps,
                         rank.gather_hidden_ratio()});
  }
  return run;
}

std::string Bytes(int64_t bytes) { return sc::util::FormatBytes(bytes); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeRO's shard levels: peak memory, step time, hidden all-gathers"};
  Options o;
  app.add_option("--rounds", o.rounds, "rounds (each runs every level once, alternating)");
  app.add_option("--steps", o.steps, "steps of each run");
  app.add_option("--warmup", o.warmup, "steps left out of each median");
  app.add_option("--width", o.width, "the MLP's hidden width (4 W x W layers)");
  app.add_option("--unshard", o.unshard, "placement.unshard of the parameters level");
  app.add_option("--schedule", o.schedule,
                 "1F1B (2 stages), or a schedule of 2 stages per worker (4 stages)");
  CLI11_PARSE(app, argc, argv);

  sc::testing::ClusterOptions options;
  options.check_lock_order = false;
  options.workers = kReplicas * kWorkers;
  options.log_level = "info";
  auto cluster = sc::bench::Value("starting a cluster", sc::testing::LocalCluster::Start(options));
  std::map<std::string, std::vector<Run>> runs;
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t i = 0; i < std::size(kLevels); ++i) {
      const std::string level = kLevels[(i + round) % std::size(kLevels)];
      runs[level].push_back(RunOnce(*cluster, o, level));
      std::fprintf(stderr, "round %d: %s done\n", round + 1, level.c_str());
    }
  }
  std::printf(
      "%d rounds of %d steps (medians after %d warm-up steps): %d replicas x %d workers, "
      "%s x 4 microbatches, MLP 64-%d x 5-64 (%d stages of equal layers), AdamW, batch 16, "
      "unshard %s\n\n",
      o.rounds, o.steps, o.warmup, kReplicas, kWorkers, o.schedule.c_str(), o.width,
      o.schedule == "1F1B" ? 2 : 4, o.unshard.c_str());
  std::printf("%-11s %9s %7s | per rank (replica 0): %-10s %-10s %-10s %-10s %s\n", "SHARD",
              "STEP ms", "RATIO", "PEAK", "HELD PAR", "HELD GRAD", "SENT/STEP", "GATHERS HIDDEN");
  double none = 0;
  for (const char* level : kLevels) {
    std::vector<double> times;
    for (const Run& r : runs[level]) {
      times.insert(times.end(), r.step_seconds.begin(), r.step_seconds.end());
    }
    const double step = sc::bench::Median(times);
    if (std::string(level) == "none") none = step;
    const Run& last = runs[level].back();
    for (int rank = 0; rank < kWorkers; ++rank) {
      std::vector<double> hidden;
      for (const Run& r : runs[level]) hidden.push_back(r.ranks[rank].gather_hidden);
      const RankFigures& f = last.ranks[rank];
      std::printf("%-11s %9s %7s | rank %d               %-10s %-10s %-10s %-10s %s\n",
                  rank == 0 ? level : "",
                  rank == 0 ? absl::StrFormat("%.1f", step * 1e3).c_str() : "",
                  rank == 0 && none > 0 ? absl::StrFormat("%.2f", step / none).c_str() : "", rank,
                  Bytes(f.peak).c_str(), Bytes(f.held_parameters).c_str(),
                  Bytes(f.held_gradients).c_str(), Bytes(f.sent_per_step).c_str(),
                  std::string(level) == "parameters"
                      ? absl::StrFormat("%.2f", sc::bench::Median(hidden)).c_str()
                      : "-");
    }
  }
  return 0;
}
