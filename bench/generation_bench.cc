// Generation tokens per second with and without the key/value cache (issue 36's benchmark), at
// contexts of 128 and 1,024 tokens, for a built-in Llama (by default hidden 512, 8 layers, 8
// heads with 4 key/value heads, SwiGLU 1408, vocabulary 8,000: 30M parameters):
//   uncached  each new token is the model's forward over the whole context (prompt + tokens so
//             far), its last position's logits: what decoding costs without a cache;
//   cached    the context runs once (prefill, timed apart), then each new token runs one
//             position, attending to the cached keys and values (LayerChainStage::
//             ForwardCached, what every stage of a job runs for WorkerService.Decode);
// both on the whole model in this process (LibTorch's threads = the cores), greedy, and
//   pipeline  `stagectl generate` on a paused job of the same model, 4 stages on 2 workers
//             (ZBVZeroBubble's V), through the coordinator: the per-token time is the
//             difference of two generations' wall times (medians of three, after a warm-up)
//             over their difference in tokens, so that the prefill and the client's start
//             cancel out. It runs after the in-process measurements, on an otherwise idle
//             machine.
// Prints the median seconds per token and tokens per second of each, and cached / uncached.
//
//   build/bench/generation_bench [--hidden N] [--layers N] [--new-tokens N] [--contexts 128,1024]
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_support.h"
#include "bench/cluster_runs.h"
#include "bench/llama_sizes.h"
#include "common/spec/spec_parser.h"
#include "tests/support/local_cluster.h"
#include "worker/model/layer_chain.h"
#include "worker/model/llama.h"

namespace sc = stagecoach;

namespace {

struct Options {
  sc::bench::LlamaSizes model{512, 1408, 8, 8, 4, 8000};
  int new_tokens = 32;
  std::vector<int> contexts = {128, 1024};
  bool pipeline = true;
};

std::string Builtin(const Options& o) {
  return absl::StrCat("{", sc::bench::LlamaKeys(o.model),
                      ", max_position_embeddings: 2048, seq: 2048, seed: 1}");
}

std::string Spec(const Options& o) {
  return absl::StrCat("name: generation-bench\nmodel: {builtin: ", Builtin(o),
                      "}\nsplit: {stages: 4}\nschedule: {kind: ZBVZeroBubble, microbatches: 4}\n"
                      "placement: {workers: 2}\ntraining: {batch_size: 4, steps: 1, loss: "
                      "cross_entropy, optimizer: {kind: adamw, lr: 0.0003}}\n"
                      "data: {kind: synthetic, seed: 1}\n");
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct Timing {
  double per_token = 0, prefill = 0;
};

// The whole model's forward over the growing context for each new token.
Timing Uncached(sc::model::StageModel& model, std::vector<int64_t> context, int n) {
  torch::NoGradGuard no_grad;
  std::vector<double> seconds;
  for (int i = 0; i < n; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const torch::Tensor logits =
        model.Forward(torch::tensor(context, torch::kInt64).unsqueeze(0))[0][-1];
    context.push_back(logits.argmax().item<int64_t>());
    seconds.push_back(Seconds(start));
  }
  return {sc::bench::Median(seconds), 0};
}

// A prefill of the context, then one position per new token.
Timing Cached(sc::model::LayerChainStage& model, std::vector<int64_t> context, int n) {
  torch::NoGradGuard no_grad;
  sc::model::StageKv kv;
  const int64_t length = static_cast<int64_t>(context.size());
  auto start = std::chrono::steady_clock::now();
  torch::Tensor logits = model.ForwardCached(
      torch::tensor(context, torch::kInt64).unsqueeze(0),
      sc::model::DecodePositions::Make({0}, {0}, length, 1, 2048, torch::kCPU), kv)[0][-1];
  Timing t;
  t.prefill = Seconds(start);
  std::vector<double> seconds;
  for (int i = 0; i < n; ++i) {
    const int64_t token = logits.argmax().item<int64_t>();
    start = std::chrono::steady_clock::now();
    logits = model.ForwardCached(
        torch::tensor({token}, torch::kInt64).view({1, 1}),
        sc::model::DecodePositions::Make({0}, {length + i}, 1, 1, 2048, torch::kCPU), kv)[0][-1];
    seconds.push_back(Seconds(start));
  }
  t.per_token = sc::bench::Median(seconds);
  return t;
}

// Wall seconds of `stagectl generate` of `tokens` greedy tokens after `prompt`.
double GenerateSeconds(sc::testing::LocalCluster& cluster, const std::string& job,
                       const std::vector<int64_t>& prompt, int tokens) {
  const auto start = std::chrono::steady_clock::now();
  sc::testing::CommandResult r =
      cluster.Stagectl({"generate", job, "--prompt-ids", absl::StrJoin(prompt, " "), "--tokens",
                        absl::StrCat(tokens), "--temperature", "0"});
  const double s = Seconds(start);
  if (r.exit_code != 0) {
    sc::bench::Fail("stagectl generate", absl::InternalError(r.err + cluster.Logs()));
  }
  return s;
}

void Row(const char* how, int context, double per_token, double prefill, double uncached) {
  const std::string prefill_s = prefill > 0 ? absl::StrFormat("%.3f", prefill) : "-";
  const std::string ratio = uncached > 0 ? absl::StrFormat("%.1fx", uncached / per_token) : "-";
  std::printf("%-9s %8d %12.4f %11.1f %11s %10s\n", how, context, per_token, 1.0 / per_token,
              prefill_s.c_str(), ratio.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Generation tokens per second of the built-in Llama with and without the cache"};
  Options o;
  sc::bench::AddLlamaSizeOptions(app, o.model);
  app.add_option("--new-tokens", o.new_tokens, "tokens generated per measurement");
  app.add_option("--contexts", o.contexts, "context lengths (prompt tokens)")->delimiter(',');
  app.add_flag("!--no-pipeline", o.pipeline, "skip the job on two workers");
  CLI11_PARSE(app, argc, argv);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(cores);
  const sc::spec::JobSpec spec = sc::bench::Value("the spec", sc::spec::ParseJobSpec(Spec(o)));
  auto model =
      sc::bench::Value("the model", sc::model::BuildLlamaStage(*spec.model.builtin, 0, o.model.layers + 3));
  auto* chain = dynamic_cast<sc::model::LayerChainStage*>(model.get());
  std::printf("llama %s: %.1fM parameters; greedy, %d new tokens per measurement (median "
              "seconds per token), one row, fp32, %d cores\n\n",
              Builtin(o).c_str(), spec.model.builtin->decoder->NumParameters() / 1e6,
              o.new_tokens, cores);

  // The model in this process first, with nothing else running: worker processes that have
  // just decoded keep their cores busy for a while, which slowed the uncached forward here
  // several times over when the two were interleaved.
  struct Measured {
    int context = 0;
    std::vector<int64_t> prompt;
    Timing plain, cached;
    double pipeline = 0;
  };
  std::vector<Measured> runs;
  for (int context : o.contexts) {
    Measured m;
    m.context = context;
    for (int i = 0; i < context; ++i) m.prompt.push_back((i * 7919) % o.model.vocab);
    m.plain = Uncached(*model, m.prompt, o.new_tokens);
    m.cached = Cached(*chain, m.prompt, o.new_tokens);
    runs.push_back(std::move(m));
  }
  if (o.pipeline) {
    sc::testing::ClusterOptions options;
    options.check_lock_order = false;
    options.workers = 2;
    auto cluster = sc::bench::Value("starting a cluster", sc::testing::LocalCluster::Start(options));
    const std::string job =
        sc::bench::Value("submitting the job", cluster->Submit(Spec(o), /*paused=*/true));
    sc::bench::Value("the job's start",
                     cluster->WaitForJob(
                         job,
                         [](const sc::v1::Job& j) {
                           return sc::bench::Finished(j) || j.state() == sc::v1::JOB_STATE_PAUSED;
                         },
                         absl::Minutes(5)));
    // A warm-up generation (the workers' first decoding step pays for their first session),
    // then the median of three of each length.
    (void)GenerateSeconds(*cluster, job, runs.front().prompt, 2);
    for (Measured& m : runs) {
      std::vector<double> few, many;
      for (int rep = 0; rep < 3; ++rep) {
        few.push_back(GenerateSeconds(*cluster, job, m.prompt, 2));
        many.push_back(GenerateSeconds(*cluster, job, m.prompt, 2 + o.new_tokens));
      }
      m.pipeline = (sc::bench::Median(many) - sc::bench::Median(few)) / o.new_tokens;
    }
    (void)cluster->Cancel(job);
  }
  std::printf("%-9s %8s %12s %11s %11s %10s\n", "HOW", "CONTEXT", "s/TOKEN", "TOKENS/s",
              "PREFILL s", "x UNCACHED");
  for (const Measured& m : runs) {
    Row("uncached", m.context, m.plain.per_token, 0, 0);
    Row("cached", m.context, m.cached.per_token, m.cached.prefill, m.plain.per_token);
    if (o.pipeline) Row("pipeline", m.context, m.pipeline, 0, m.plain.per_token);
  }
  return 0;
}
