// Measures data-parallel replicas of the pipeline on CPU: every task (replica r, rank p) is a
// thread of this process with its own pipeline transport (Gloo, loopback) and data-parallel
// group (ring collectives over Gloo), its MLP stages (BuildMlpStage), the lowered list of its
// schedule, and a GradientReducer on a communication thread, as a worker runs them.
//
//   1. Hidden fraction of the gradient reduction (1 - compute's wait / reduction span, median
//      over steps, per rank) for 1F1B and ZBVZeroBubble with 2 replicas, overlapped and not.
//   2. Step time of 2 replicas x 1 rank against 1 replica x 2 ranks on the same global batch.
//   3. Ring all-reduce (2 ranks, ring over Gloo) for 1 to 64 MiB against a point-to-point send of
//      the same size: bus bandwidth = 2(n-1)/n bytes / time.
//
// Times are milliseconds, medians over the measured steps; a step runs from the executor's start
// to the end of the optimizer step (and, with sharding, the parameter all-gather) on the slowest
// task. Every task computes on one LibTorch thread; with more tasks than cores they share them,
// which the figures include.
//
//   build/bench/data_parallel_bench [--width N] [--layers N] [--batch N] [--microbatches N]
//                                   [--steps N] [--warmup N]
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "common/schedule/build.h"
#include "common/util/work_queue.h"
#include "worker/collectives/ring/factory.h"
#include "worker/model/mlp.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/executor/training_setup.h"
#include "worker/runtime/training/gradient_reduction.h"
#include "worker/runtime/data/training_data.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace rt = stagecoach::runtime;
namespace sched = stagecoach::schedule;
namespace tr = stagecoach::transport;
namespace co = stagecoach::collectives;

namespace {

using stagecoach::bench::Check;
using stagecoach::bench::Median;
using stagecoach::bench::Value;

constexpr absl::Duration kWait = absl::Seconds(120);

struct Options {
  int width = 512;
  int layers = 8;
  int batch = 128;
  int microbatches = 4;  // per replica
  int steps = 10;
  int warmup = 2;
};

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

std::unique_ptr<tr::Transport> Connect(tr::InMemoryStore& store, const std::string& prefix,
                                       int rank, int world) {
  tr::GlooOptions options;
  options.rank = rank;
  options.world_size = world;
  options.key_prefix = prefix;
  options.connect_timeout = kWait;
  return Value("connecting " + prefix, tr::CreateGlooTransport(options, &store));
}

struct Config {
  sched::ScheduleKind kind = sched::ScheduleKind::k1F1B;
  int ranks = 2;
  int stages_per_rank = 1;
  int replicas = 2;
  bool overlap = true;
};

struct Result {
  double step_ms = 0;              // median over steps of the slowest task
  std::vector<double> hidden;      // per task (replica * ranks + rank): median hidden ratio
  std::vector<double> reduce_ms;   // per task: median reduction span
};

Result Run(const Config& c, const Options& o) {
  sched::ScheduleConfig config;
  config.kind = c.kind;
  config.num_ranks = c.ranks;
  config.stages_per_rank = c.stages_per_rank;
  config.num_microbatches = o.microbatches;
  const sched::BuiltSchedule built = Value("schedule", sched::BuildSchedule(config));
  const int num_stages = sched::NumStages(config);
  const int per_stage = o.layers / num_stages;
  stagecoach::spec::BuiltinModel model;
  model.family = "mlp";
  model.sizes.assign(o.layers + 1, o.width);
  model.seed = 1;
  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({o.batch, o.width});
  const torch::Tensor y = torch::randn({o.batch, o.width});

  const int tasks = c.ranks * c.replicas;
  std::vector<std::vector<double>> step_ms(tasks), hidden(tasks), reduce_ms(tasks);
  tr::InMemoryStore store;
  std::vector<std::thread> threads;
  for (int task = 0; task < tasks; ++task) {
    threads.emplace_back([&, task] {
      torch::set_num_threads(1);
      const int replica = task / c.ranks, rank = task % c.ranks;
      auto pipe = Connect(store, absl::StrCat("pipe/", replica, "/"), rank, c.ranks);
      std::unique_ptr<co::Collectives> group;
      if (c.replicas > 1) {
        group = Value("group", co::CreateRingCollectives(Connect(
                                   store, absl::StrCat("dp/", rank, "/"), replica, c.replicas)));
      }
      std::vector<std::unique_ptr<stagecoach::model::StageModel>> owned;
      std::map<int, stagecoach::model::StageModel*> stages;
      std::vector<torch::Tensor> parameters;
      for (int s = 0; s < num_stages; ++s) {
        if (built.stage_to_rank[s] != rank) continue;
        owned.push_back(Value("stage", stagecoach::model::BuildMlpStage(model, s * per_stage,
                                                                        (s + 1) * per_stage)));
        stages[s] = owned.back().get();
        for (const torch::Tensor& p : owned.back()->Parameters()) parameters.push_back(p);
      }
      stagecoach::spec::OptimizerSpec sgd;
      sgd.lr = 1e-3;
      auto optimizer = Value("optimizer", rt::MakeOptimizer(sgd, parameters));
      stagecoach::WorkQueue comm(1);
      std::unique_ptr<rt::GradientReducer> reducer;
      rt::ExecutorOptions options;
      if (group != nullptr) {
        rt::GradientReductionOptions ro;
        ro.overlap = c.overlap;
        ro.timeout = kWait;
        reducer = std::make_unique<rt::GradientReducer>(ro, group.get(), stages, &comm);
        options.on_gradients_ready = [&](int s) { reducer->StageReady(s); };
      }
      options.rank = rank;
      options.num_stages = num_stages;
      options.num_microbatches = o.microbatches;
      options.stage_to_rank = built.stage_to_rank;
      options.comm_timeout = kWait;
      rt::PipelineExecutor executor(options, pipe.get(), stages);
      const rt::ReplicaShare share{replica, c.replicas};
      const std::vector<torch::Tensor> inputs = rt::ReplicaMicrobatches(x, o.microbatches, share);
      const std::vector<torch::Tensor> targets = rt::ReplicaMicrobatches(y, o.microbatches, share);
      std::vector<rt::TensorMeta> metas;
      for (const torch::Tensor& t : inputs) metas.push_back({t.sizes().vec(), t.scalar_type()});
      Check("shapes", executor.AgreeShapes(metas));
      std::vector<sched::Action> actions;
      for (const auto& a : built.lowered[rank]) {
        if (a.has_value()) actions.push_back(*a);
      }
      for (int step = 0; step < o.warmup + o.steps; ++step) {
        optimizer->zero_grad();
        Check("barrier", pipe->Barrier(kWait));
        const absl::Time start = absl::Now();
        if (reducer) reducer->BeginStep(start);
        Value("step", executor.RunStep(actions, inputs, targets));
        rt::ReductionReport report;
        if (reducer) report = Value("reduction", reducer->Finish());
        optimizer->step();
        if (step < o.warmup) continue;
        step_ms[task].push_back(Ms(absl::Now() - start));
        hidden[task].push_back(report.hidden_ratio);
        reduce_ms[task].push_back(Ms(report.span));
      }
      if (reducer) reducer.reset();
    });
  }
  for (std::thread& t : threads) t.join();
  Result result;
  std::vector<double> slowest;
  for (int k = 0; k < o.steps; ++k) {
    double ms = 0;
    for (int t = 0; t < tasks; ++t) ms = std::max(ms, step_ms[t][k]);
    slowest.push_back(ms);
  }
  result.step_ms = Median(slowest);
  for (int t = 0; t < tasks; ++t) {
    result.hidden.push_back(Median(hidden[t]));
    result.reduce_ms.push_back(Median(reduce_ms[t]));
  }
  return result;
}

void PrintHidden(const std::string& name, const Config& c, const Options& o) {
  const Result on = Run(c, o);
  Config off = c;
  off.overlap = false;
  const Result no = Run(off, o);
  std::printf("%-26s step %8.1f ms overlapped, %8.1f ms not (ratio %.3f)\n", name.c_str(),
              on.step_ms, no.step_ms, no.step_ms / on.step_ms);
  for (size_t t = 0; t < on.hidden.size(); ++t) {
    std::printf("  replica %zu rank %zu: hidden %.3f (not overlapped %.3f), reduction %.1f ms\n",
                t / c.ranks, t % c.ranks, on.hidden[t], no.hidden[t], on.reduce_ms[t]);
  }
}

// Median time of `fn` over `n` runs on two ranks (after one untimed run), in ms.
double TwoRanks(const std::function<void(int, tr::Transport&, bool)>& fn, int n,
                const std::function<std::unique_ptr<co::Collectives>(std::unique_ptr<tr::Transport>)>&
                    wrap,
                const std::function<void(int, co::Collectives&)>& collective) {
  tr::InMemoryStore store;
  std::vector<double> times;
  std::vector<std::thread> threads;
  static int groups = 0;
  const std::string prefix = absl::StrCat("bw/", groups++, "/");
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto t = Connect(store, prefix, rank, 2);
      std::unique_ptr<co::Collectives> group;
      tr::Transport* raw = t.get();
      if (wrap) group = wrap(std::move(t));
      for (int i = 0; i <= n; ++i) {
        Check("barrier", group ? absl::OkStatus() : raw->Barrier(kWait));
        const absl::Time start = absl::Now();
        if (group) {
          collective(rank, *group);
        } else {
          fn(rank, *raw, true);
        }
        if (rank == 0 && i > 0) times.push_back(Ms(absl::Now() - start));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  return Median(times);
}

void PrintBandwidth() {
  std::printf("\n3. Ring all-reduce (2 ranks, ring over Gloo) against a point-to-point send\n");
  std::printf("%10s %12s %14s %14s %12s %14s\n", "size", "all-reduce", "algo GB/s", "bus GB/s",
              "send", "send GB/s");
  for (int64_t mib : {1, 4, 16, 32, 64}) {
    const int64_t bytes = mib << 20;
    const int64_t count = bytes / 4;
    std::vector<std::vector<float>> buffers(2, std::vector<float>(count, 1.0f));
    const double reduce_ms = TwoRanks(
        nullptr, 5,
        [](std::unique_ptr<tr::Transport> t) {
          return Value("ring", co::CreateRingCollectives(std::move(t)));
        },
        [&](int rank, co::Collectives& g) {
          Check("all-reduce", g.AllReduce(buffers[rank].data(), count, co::DataType::kFloat32,
                                          co::ReduceOp::kSum, kWait));
        });
    std::vector<char> out(bytes, 1), in(bytes, 0);
    const double send_ms = TwoRanks(
        [&](int rank, tr::Transport& t, bool) {
          if (rank == 0) {
            Check("send", Value("post", t.Send(out.data(), bytes, 1, 1))->Wait(kWait));
          } else {
            Check("recv", Value("post", t.Recv(in.data(), bytes, 0, 1))->Wait(kWait));
          }
          Check("barrier", t.Barrier(kWait));
        },
        5, nullptr, nullptr);
    const double gb = static_cast<double>(bytes) / 1e9;
    constexpr double kRingFactor = 2.0 * (2 - 1) / 2;  // 2(n-1)/n for n = 2
    std::printf("%7lld MiB %9.2f ms %14.2f %14.2f %9.2f ms %14.2f\n",
                static_cast<long long>(mib), reduce_ms, gb / (reduce_ms / 1e3),
                kRingFactor * gb / (reduce_ms / 1e3), send_ms, gb / (send_ms / 1e3));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Data-parallel replicas of the pipeline on CPU");
  Options o;
  app.add_option("--width", o.width, "MLP width");
  app.add_option("--layers", o.layers, "MLP layers (a multiple of the stages)");
  app.add_option("--batch", o.batch, "global batch rows");
  app.add_option("--microbatches", o.microbatches, "microbatches per replica");
  app.add_option("--steps", o.steps, "measured steps");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  CLI11_PARSE(app, argc, argv);
  std::printf("MLP %d x Linear(%d, %d), global batch %d, %d microbatches per replica, %d steps, "
              "%u hardware threads\n\n",
              o.layers, o.width, o.width, o.batch, o.microbatches, o.steps,
              std::thread::hardware_concurrency());
  std::printf("1. Hidden fraction of the gradient reduction, 2 replicas\n");
  PrintHidden("1F1B 2 ranks x 2 replicas", {sched::ScheduleKind::k1F1B, 2, 1, 2, true}, o);
  PrintHidden("ZBV 2 ranks x 2 replicas", {sched::ScheduleKind::kZBVZeroBubble, 2, 2, 2, true}, o);

  std::printf("\n2. Same global batch: 2 replicas x 1 rank against 1 replica x 2 ranks (1F1B)\n");
  Options one = o;
  const Result dp = Run({sched::ScheduleKind::kGPipe, 1, 1, 2, true}, one);
  Options pp = o;
  pp.microbatches = o.microbatches * 2;
  const Result pipe = Run({sched::ScheduleKind::k1F1B, 2, 1, 1, true}, pp);
  std::printf("  D=2 x P=1 (GPipe on one rank): %8.1f ms\n", dp.step_ms);
  std::printf("  D=1 x P=2 (1F1B):              %8.1f ms   ratio P/D %.3f\n", pipe.step_ms,
              pipe.step_ms / dp.step_ms);
  PrintBandwidth();
  return 0;
}
