// What the training recipe costs a step (worker/runtime/training/step_recipe.h), on this machine:
//   - StepRecipe::Prepare on one rank's gradients (the learning rate, every gradient's norm, the
//     non-finite check, and with --clip the scaling), for a stage of 8 x Linear(1024, 1024)
//     (about 33 MB of float32 gradients, the peer benchmark's model), against that stage's own
//     forward and backward on one microbatch of --rows rows;
//   - the job reduction's round trip over 2 ranks (two threads, loopback Gloo): 2(P-1) messages
//     of 8(P+1) bytes, one after another.
// Every figure is the median of --iterations runs after --warmup untimed ones.
//
//   build/bench/recipe_bench [--iterations N] [--warmup N] [--rows N]
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "bench/bench_support.h"
#include "worker/runtime/training/job_reduction.h"
#include "worker/runtime/training/step_recipe.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace {

using stagecoach::bench::Check;
using stagecoach::bench::Median;
using stagecoach::bench::Value;
using Clock = std::chrono::steady_clock;
namespace rt = stagecoach::runtime;
namespace tr = stagecoach::transport;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::unique_ptr<tr::Transport> Connect(tr::InMemoryStore& store, int rank, int ranks) {
  tr::GlooOptions options;
  options.rank = rank;
  options.world_size = ranks;
  options.key_prefix = "recipe-bench/";
  options.connect_timeout = absl::Seconds(30);
  return Value("connect", tr::CreateGlooTransport(options, &store));
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20, warmup = 3, rows = 32;
  CLI::App app{"The training recipe's cost per step"};
  app.add_option("--iterations", iterations, "timed runs per figure");
  app.add_option("--warmup", warmup, "untimed runs first");
  app.add_option("--rows", rows, "rows of the microbatch the stage's forward and backward take");
  CLI11_PARSE(app, argc, argv);
  torch::manual_seed(0);

  torch::nn::Sequential stage;
  for (int i = 0; i < 8; ++i) stage->push_back(torch::nn::Linear(1024, 1024));
  std::vector<torch::Tensor> params = stage->parameters();
  int64_t bytes = 0;
  for (const auto& p : params) bytes += p.numel() * 4;
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({rows, 1024});

  std::vector<double> compute;
  for (int i = 0; i < warmup + iterations; ++i) {
    optimizer.zero_grad();
    const auto start = Clock::now();
    stage->forward(x).square().mean().backward();
    if (i >= warmup) compute.push_back(MsSince(start));
  }

  tr::InMemoryStore one_store;
  std::unique_ptr<tr::Transport> alone = Connect(one_store, 0, 1);
  rt::JobReduction reduction(alone.get(), torch::kCPU, absl::Seconds(30));
  for (bool clip : {false, true}) {
    rt::StepRecipeOptions options;
    options.timeline_steps = 1000;
    if (clip) options.training.grad_clip_max_norm = 1e-3;  // clips every step
    rt::StepRecipe recipe(options, &reduction);
    std::vector<double> prepare;
    for (int i = 0; i < warmup + iterations; ++i) {
      const auto start = Clock::now();
      Value("prepare", recipe.Prepare(i, optimizer));
      if (i >= warmup) prepare.push_back(MsSince(start));
    }
    std::printf("%-34s %8.3f ms  (%.1f%% of the stage's forward+backward on %d rows, %.3f ms; "
                "%.1f MB of gradients)\n",
                clip ? "Prepare, clipping every step" : "Prepare, no clipping (norm, check)",
                Median(prepare), 100 * Median(prepare) / Median(compute), rows, Median(compute),
                bytes / 1e6);
  }

  // The job reduction's round trip over 2 ranks.
  tr::InMemoryStore store;
  std::vector<double> round_trips;
  std::thread peer([&] {
    std::unique_ptr<tr::Transport> t = Connect(store, 1, 2);
    rt::JobReduction r(t.get(), torch::kCPU, absl::Seconds(30));
    for (int i = 0; i < warmup + iterations; ++i) Value("sum", r.SumOverRanks({1.0, 0.0, 0.0}));
    Check("barrier", t->Barrier(absl::Seconds(30)));
  });
  {
    std::unique_ptr<tr::Transport> t = Connect(store, 0, 2);
    rt::JobReduction r(t.get(), torch::kCPU, absl::Seconds(30));
    for (int i = 0; i < warmup + iterations; ++i) {
      const auto start = Clock::now();
      Value("sum", r.SumOverRanks({1.0, 0.0, 0.0}));
      if (i >= warmup) round_trips.push_back(MsSince(start));
    }
    Check("barrier", t->Barrier(absl::Seconds(30)));
  }
  peer.join();
  std::printf("%-34s %8.3f ms\n", "job reduction, 2 ranks, round trip", Median(round_trips));
  return 0;
}
