// Training throughput of the built-in Llama family (issue 36's benchmark): a ~100M-parameter
// configuration (by default hidden 768, 12 layers, 12 heads with 4 key/value heads, SwiGLU 2048,
// vocabulary 16,000: 109M parameters) trained for a few steps on synthetic tokens, in fp32 and
// bf16, three ways side by side in one run:
//   plain     the same model (worker/model/llama.h, built whole) trained by plain LibTorch in
//             this process: forward, cross-entropy, backward per microbatch, AdamW, no pipeline,
//             no daemons; LibTorch's threads = the machine's cores;
//   1 worker  a job on real daemons (a coordinator and one worker on loopback), one stage;
//   2 workers the same job as 1F1B over two workers (two stages), each worker one core.
// Prints tokens per second (batch x seq / the median step time after the warm-up steps) and
// the ratio to plain. The jobs' step times are the coordinator's (stagectl watch -o json).
//
//   build/bench/llama_bench [--hidden N] [--layers N] [--seq N] [--batch N] [--steps N]
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_support.h"
#include "bench/cluster_runs.h"
#include "bench/llama_sizes.h"
#include "common/spec/spec_parser.h"
#include "nlohmann/json.hpp"
#include "tests/support/local_cluster.h"
#include "worker/model/llama.h"
#include "worker/model/precision.h"

namespace sc = stagecoach;
using json = nlohmann::json;

namespace {

struct Options {
  sc::bench::LlamaSizes model{768, 2048, 12, 12, 4, 16000};
  int seq = 128, batch = 4, microbatches = 2, steps = 4, warmup = 1;
};

std::string Builtin(const Options& o) {
  return absl::StrCat("{", sc::bench::LlamaKeys(o.model), ", seq: ", o.seq, ", seed: 1}");
}

std::string Spec(const Options& o, int workers, bool bf16) {
  return absl::StrCat("name: llama-bench-", workers, bf16 ? "-bf16" : "-fp32",
                      "\nmodel: {builtin: ", Builtin(o), "}\nsplit: {stages: ", workers, "}\n",
                      "schedule: {kind: 1F1B, microbatches: ", o.microbatches, "}\n",
                      "placement: {workers: ", workers, "}\ntraining: {batch_size: ", o.batch,
                      ", steps: ", o.steps,
                      ", loss: cross_entropy, optimizer: {kind: adamw, "
                      "lr: 0.0003}",
                      bf16 ? ", precision: bf16" : "", "}\n", "data: {kind: synthetic, seed: 1}\n");
}

// Median step seconds of a job on the cluster, after the warm-up steps.
double JobStepSeconds(sc::testing::LocalCluster& cluster, const Options& o, int workers,
                      bool bf16) {
  const sc::v1::Job done = sc::bench::RunJob(cluster, Spec(o, workers, bf16), absl::Minutes(30),
                                             absl::StrCat("the ", workers, "-worker job"));
  std::vector<double> seconds;
  for (const json& event : sc::bench::StepEvents(cluster, done.id(), o.warmup)) {
    seconds.push_back(event["step_time_seconds"].get<double>());
  }
  return sc::bench::Median(seconds);
}

// Median step seconds of the same model trained by plain LibTorch in this process.
double PlainStepSeconds(const Options& o, bool bf16) {
  const sc::spec::JobSpec spec =
      sc::bench::Value("the spec", sc::spec::ParseJobSpec(Spec(o, 1, bf16)));
  auto model = sc::bench::Value(
      "the model", sc::model::BuildLlamaStage(*spec.model.builtin, 0, o.model.layers + 3));
  torch::optim::AdamW optimizer(model->Parameters(), torch::optim::AdamWOptions(3e-4));
  const sc::model::Precision precision =
      bf16 ? sc::model::Precision::kBf16 : sc::model::Precision::kFp32;
  std::vector<double> seconds;
  for (int step = 0; step < o.steps; ++step) {
    const torch::Tensor tokens =
        torch::randint(0, o.model.vocab, {o.batch, o.seq + 1}, torch::kInt64);
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    const auto xs = torch::tensor_split(tokens.slice(1, 0, o.seq), o.microbatches, 0);
    const auto ys = torch::tensor_split(tokens.slice(1, 1, o.seq + 1), o.microbatches, 0);
    for (int mb = 0; mb < o.microbatches; ++mb) {
      torch::Tensor logits;
      {
        sc::model::AutocastGuard autocast(precision, torch::kCPU);
        logits = model->Forward(xs[mb]);
      }
      const torch::Tensor loss = torch::nn::functional::cross_entropy(
          sc::model::ToFloat32(logits).reshape({-1, o.model.vocab}), ys[mb].reshape(-1));
      (loss / o.microbatches).backward();
    }
    optimizer.step();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step >= o.warmup) seconds.push_back(s);
  }
  return sc::bench::Median(seconds);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Training tokens per second of the built-in Llama: plain LibTorch against jobs"};
  Options o;
  sc::bench::AddLlamaSizeOptions(app, o.model);
  app.add_option("--seq", o.seq, "tokens per row");
  app.add_option("--batch", o.batch, "rows per step");
  app.add_option("--microbatches", o.microbatches, "microbatches per step");
  app.add_option("--steps", o.steps, "steps per run");
  app.add_option("--warmup", o.warmup, "steps left out of each median");
  CLI11_PARSE(app, argc, argv);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(cores);

  const sc::spec::JobSpec probe =
      sc::bench::Value("the spec", sc::spec::ParseJobSpec(Spec(o, 1, false)));
  std::printf(
      "llama %s: %.1fM parameters; batch %d x seq %d = %d tokens per step, %d "
      "microbatches, AdamW; medians of %d steps after %d warm-up, %d cores\n\n",
      Builtin(o).c_str(), probe.model.builtin->decoder->NumParameters() / 1e6, o.batch, o.seq,
      o.batch * o.seq, o.microbatches, o.steps - o.warmup, o.warmup, cores);
  sc::testing::ClusterOptions options;
  options.check_lock_order = false;
  options.workers = 2;
  auto cluster = sc::bench::Value("starting a cluster", sc::testing::LocalCluster::Start(options));
  std::printf("%-10s %-10s %12s %12s %10s\n", "PRECISION", "RUN", "STEP s", "TOKENS/s", "x PLAIN");
  for (const bool bf16 : {false, true}) {
    const double plain = PlainStepSeconds(o, bf16);
    const double one = JobStepSeconds(*cluster, o, 1, bf16);
    const double two = JobStepSeconds(*cluster, o, 2, bf16);
    const double tokens = static_cast<double>(o.batch) * o.seq;
    for (const auto& [name, s] :
         {std::pair<const char*, double>{"plain", plain}, {"1 worker", one}, {"2 workers", two}}) {
      std::printf("%-10s %-10s %12.2f %12.1f %10.2f\n", bf16 ? "bf16" : "fp32", name, s, tokens / s,
                  plain / s);
    }
  }
  return 0;
}
