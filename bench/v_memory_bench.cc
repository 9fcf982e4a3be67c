// VHalf's and VMin's memory against 1F1B's on real workers, at any number of ranks: a
// coordinator and --ranks CPU workers on loopback (real daemons) train a GPT whose attention
// keeps most of a block's activations (what W needs after I is a small part of them), with
// every rank holding --blocks-per-rank blocks under each schedule: 1F1B on p stages, the V
// schedules on 2p. A memory limit far above the model makes the coordinator profile it, so each
// job carries the planner's predicted peak per rank beside the peak its worker measured (the
// counting allocator, last step). Prints per schedule the largest rank's measured and predicted
// peak, their ratio, the share of 1F1B's largest measured peak, and the schedule's budget:
// (p+2)/2 and (p+4)/3 microbatches of a rank's layers against 1F1B's p (docs/schedules.md).
// The paper's 1/2 and 1/3 are the budgets' limits as p grows; tests/e2e/memory_measured_test
// checks p = 4.
//
//   v_memory_bench [--ranks 16] [--blocks-per-rank 2] [--microbatches 32] [--rows 1]
//                  [--seq 256] [--steps 2]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_support.h"
#include "bench/cluster_runs.h"
#include "tests/support/local_cluster.h"

namespace sc = stagecoach;

namespace {

struct Options {
  int ranks = 16;
  int blocks_per_rank = 2;
  int microbatches = 32;
  int rows = 1;  // rows per microbatch
  int seq = 256;
  int steps = 2;
};

// Stage boundaries every `blocks_per_stage` blocks of `blocks`.
std::string SpecYaml(const Options& o, const std::string& kind, int blocks_per_stage) {
  const int blocks = o.ranks * o.blocks_per_rank;
  std::string points;
  for (int b = blocks_per_stage; b < blocks; b += blocks_per_stage) {
    absl::StrAppend(&points, points.empty() ? "" : ", ", "\"blocks.", b, "\": beginning");
  }
  return absl::StrCat("name: v-memory-", absl::AsciiStrToLower(kind), "\n",
                      "model: {builtin: {family: gpt, vocab: 64, d_model: 32, layers: ", blocks,
                      ", heads: 4, seq: ", o.seq, ", seed: 5}}\n", "split: {points: {", points,
                      "}}\n", "schedule: {kind: ", kind, ", microbatches: ", o.microbatches, "}\n",
                      "placement: {workers: ", o.ranks, ", memory_limit: 64GiB}\n",
                      "training: {batch_size: ", o.rows * o.microbatches, ", steps: ", o.steps,
                      ", loss: cross_entropy, optimizer: {kind: sgd, lr: 0.01}}\n",
                      "data: {kind: synthetic, seed: 3}\n");
}

struct Peaks {
  int64_t measured = 0;   // the largest rank's
  int64_t predicted = 0;  // that rank's prediction
  int rank = -1;
};

Peaks Run(sc::testing::LocalCluster& cluster, const std::string& spec) {
  const sc::v1::Job job = sc::bench::RunJob(cluster, spec, absl::Minutes(30), "a job");
  Peaks peaks;
  for (const sc::v1::RankMemory& m : job.memory()) {
    if (m.measured_peak_bytes() > peaks.measured) {
      peaks = {m.measured_peak_bytes(), m.predicted_peak_bytes(), m.rank()};
    }
  }
  if (peaks.rank < 0) sc::bench::Fail("job " + job.id(), absl::InternalError("no measured peak"));
  return peaks;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"VHalf and VMin against 1F1B: measured peak memory on real workers"};
  Options o;
  app.add_option("--ranks", o.ranks, "pipeline ranks (workers)");
  app.add_option("--blocks-per-rank", o.blocks_per_rank, "GPT blocks each rank holds (even)");
  app.add_option("--microbatches", o.microbatches, "microbatches per step");
  app.add_option("--rows", o.rows, "rows (sequences) per microbatch");
  app.add_option("--seq", o.seq, "tokens per row");
  app.add_option("--steps", o.steps, "steps per job (the peak is the last step's)");
  CLI11_PARSE(app, argc, argv);
  if (o.ranks < 2 || o.blocks_per_rank < 2 || o.blocks_per_rank % 2 != 0) {
    sc::bench::Fail("options", absl::InvalidArgumentError(
                                   "--ranks must be >= 2 and --blocks-per-rank even and >= 2"));
  }

  sc::testing::ClusterOptions options;
  options.check_lock_order = false;
  options.workers = o.ranks;
  options.comm_timeout = "600s";
  auto cluster = sc::bench::Value("cluster", sc::testing::LocalCluster::Start(options));
  const int p = o.ranks;
  struct Row {
    std::string kind;
    int blocks_per_stage;
    double budget;  // share of 1F1B's activations
  };
  const std::vector<Row> rows = {
      {"1F1B", o.blocks_per_rank, 1.0},
      {"VHalf", o.blocks_per_rank / 2, static_cast<double>((p + 2) / 2) / p},
      {"VMin", o.blocks_per_rank / 2, static_cast<double>((p + 4) / 3) / p}};
  std::printf("%d ranks, %d blocks per rank, %d microbatches of %d x %d tokens\n", p,
              o.blocks_per_rank, o.microbatches, o.rows, o.seq);
  std::printf("%-8s %6s %14s %14s %10s %12s %8s\n", "schedule", "rank", "measured", "predicted",
              "meas/pred", "of 1F1B", "budget");
  double one_f_one_b = 0;
  for (const Row& row : rows) {
    const Peaks peaks = Run(*cluster, SpecYaml(o, row.kind, row.blocks_per_stage));
    if (row.kind == "1F1B") one_f_one_b = static_cast<double>(peaks.measured);
    std::printf("%-8s %6d %14lld %14lld %10.3f %12.3f %8.3f\n", row.kind.c_str(), peaks.rank,
                static_cast<long long>(peaks.measured), static_cast<long long>(peaks.predicted),
                static_cast<double>(peaks.measured) / static_cast<double>(peaks.predicted),
                static_cast<double>(peaks.measured) / one_f_one_b, row.budget);
    std::fflush(stdout);
  }
  return 0;
}
