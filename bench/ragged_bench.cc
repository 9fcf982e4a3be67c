// Ragged batches through the pipeline runtime on CPU (issue 40): ranks are threads of this
// process, each a PipelineExecutor over real Gloo on loopback running the built-in GPT's
// stages.
//
//   1. The shape header's cost: the same full-window microbatches with dynamic shapes off (the
//      shapes agreed at set-up) and on, the header framed with each activation (as on Gloo) or
//      ahead of it in a message of its own, the value's buffer allocated when the header is in
//      (as on a transport of exact receives, NCCL, here Gloo told it has no shorter receives),
//      steps of the three alternating on the same ranks, for 1F1B, Interleaved1F1B and
//      ZBVZeroBubble: median step times, and the median of the ratios of each step to its
//      fixed-shape neighbour (less exposed to the machine's drift than the ratio of the
//      medians).
//   2. Ragged steps: microbatches of rows of lengths drawn from 1 to seq, each padded to its own
//      longest row (dynamic shapes), against full windows: the median step time and the
//      positions computed per second.
//   3. Documents as they are (Debian's fortunes, bytes as tokens): fixed windows (documents cut
//      and run together), pad (a row per document) and pack (whole documents per row, kept
//      apart), as the workers make the rows: the tokens the loss counts per second and the share
//      of computed positions that were padding, on ZBVZeroBubble.
//
//   build/bench/ragged_bench [--d-model N] [--layers N] [--heads N] [--seq N] [--vocab N]
//                            [--batch N] [--microbatches N] [--steps N] [--warmup N]
//                            [--parts 123]   (which of the three to run)
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "common/schedule/build.h"
#include "tests/support/exact_receives_transport.h"
#include "worker/model/gpt.h"
#include "worker/runtime/data/document_rows.h"
#include "worker/runtime/device/compute_slice.h"
#include "worker/runtime/device/compute_threads.h"
#include "worker/runtime/device/cpu_pinning.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/executor/training_setup.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace rt = stagecoach::runtime;
namespace sched = stagecoach::schedule;
namespace tr = stagecoach::transport;

namespace {

using stagecoach::bench::Check;
using stagecoach::bench::Median;
using stagecoach::bench::Value;

constexpr int kRanks = 2;
constexpr absl::Duration kWait = absl::Seconds(120);

struct Options {
  int64_t d_model = 256, layers = 8, heads = 8, seq = 256, vocab = 512, batch = 16;
  int microbatches = 8, steps = 8, warmup = 2;
  std::string parts = "123";
};

// How a variant's executor treats shapes: agreed at set-up, or varying with the header framed
// with each activation or sent ahead of it.
enum class Shapes { kFixed, kFramed, kAhead };

stagecoach::spec::BuiltinModel Gpt(const Options& o) {
  stagecoach::spec::BuiltinModel m;
  m.family = "gpt";
  m.vocab = o.vocab;
  m.d_model = o.d_model;
  m.layers = o.layers;
  m.heads = o.heads;
  m.seq = o.seq;
  m.seed = 1;
  return m;
}

// One step's microbatches: token rows [batch / M, L], L = seq (full windows) or each microbatch's
// longest of lengths drawn uniformly from 1 to seq.
struct Batch {
  std::vector<torch::Tensor> inputs, targets;
  std::vector<torch::Tensor> segments;  // packed rows only
  int64_t positions = 0;                // computed, padding included
  int64_t counted = 0;                  // targets the loss counts
};

Batch MakeBatch(const Options& o, bool ragged, uint64_t seed) {
  torch::manual_seed(seed);
  Batch b;
  const int64_t rows = o.batch / o.microbatches;
  for (int mb = 0; mb < o.microbatches; ++mb) {
    int64_t len = o.seq;
    if (ragged) len = torch::randint(1, o.seq + 1, {rows}, torch::kInt64).max().item<int64_t>();
    b.inputs.push_back(torch::randint(0, o.vocab, {rows, len}, torch::kInt64));
    b.targets.push_back(torch::randint(0, o.vocab, {rows, len}, torch::kInt64));
    b.positions += rows * len;
  }
  return b;
}

// Step times (ms) of `kind`, per variant: variant v runs on an executor that treats shapes as
// shapes[v] over batches batches[v]; the variants' steps alternate on the same ranks.
std::vector<std::vector<double>> Measure(sched::ScheduleKind kind, const Options& o,
                                         const std::vector<Shapes>& shapes,
                                         const std::vector<std::vector<Batch>>& batches) {
  sched::ScheduleConfig config;
  config.kind = kind;
  config.num_ranks = kRanks;
  config.stages_per_rank = sched::DefaultStagesPerRank(kind);
  config.num_microbatches = o.microbatches;
  const sched::BuiltSchedule built = Value("building the schedule", sched::BuildSchedule(config));
  const int num_stages = static_cast<int>(built.stage_to_rank.size());
  const int layers = static_cast<int>(o.layers) + 3;
  std::vector<std::vector<double>> ms(shapes.size());
  tr::InMemoryStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      // As a worker's compute thread: pinned with a short time slice where the CPUs allow.
      rt::PinningInputs pinning;
      pinning.affinity = rt::AffinityMask();
      pinning.quota = rt::ReadCpuAllowance().quota_cpus.has_value();
      pinning.ranks_on_host = kRanks;
      pinning.index_on_host = rank;
      const rt::PinningChoice choice = rt::ChooseComputeCpus(pinning);
      if (!choice.cpus.empty()) {
        Check("pinning", rt::PinCallingThread(choice.cpus));
        rt::RequestTimeSlice(rt::kComputeTimeSlice);
      }
      torch::set_num_threads(1);
      tr::GlooOptions gloo;
      gloo.rank = rank;
      gloo.world_size = kRanks;
      gloo.key_prefix = "ragged/";
      auto transport = Value("connecting", tr::CreateGlooTransport(gloo, &store));
      stagecoach::testing::ExactReceivesTransport exact(transport.get());
      std::vector<std::unique_ptr<stagecoach::model::StageModel>> owned;
      std::map<int, stagecoach::model::StageModel*> stages;
      for (int s = 0; s < num_stages; ++s) {
        if (built.stage_to_rank[s] != rank) continue;
        owned.push_back(Value("building a stage",
                              stagecoach::model::BuildGptStage(Gpt(o), s * layers / num_stages,
                                                               (s + 1) * layers / num_stages)));
        stages[s] = owned.back().get();
      }
      std::vector<std::unique_ptr<rt::PipelineExecutor>> executors;
      for (Shapes v : shapes) {
        rt::ExecutorOptions options;
        options.rank = rank;
        options.num_stages = num_stages;
        options.num_microbatches = o.microbatches;
        options.stage_to_rank = built.stage_to_rank;
        options.comm_timeout = kWait;
        options.loss = rt::LossKind::kCrossEntropy;
        options.dynamic_shapes = v != Shapes::kFixed;
        executors.push_back(std::make_unique<rt::PipelineExecutor>(
            options, v == Shapes::kAhead ? &exact : transport.get(), stages));
        Check(
            "agreeing shapes",
            executors.back()->AgreeShapes(std::vector<rt::TensorMeta>(
                o.microbatches, rt::TensorMeta{{o.batch / o.microbatches, o.seq}, torch::kInt64})));
      }
      std::vector<sched::Action> actions;
      for (const auto& a : built.lowered[rank]) {
        if (a.has_value()) actions.push_back(*a);
      }
      for (int step = 0; step < o.warmup + o.steps; ++step) {
        for (size_t v = 0; v < executors.size(); ++v) {
          for (auto& [s, stage] : stages) {
            for (auto& p : stage->Parameters()) {
              if (p.grad().defined()) p.mutable_grad().zero_();
            }
          }
          const Batch& b = batches[v][step % batches[v].size()];
          Check("barrier", transport->Barrier(kWait));
          rt::StepResult r =
              Value("step", executors[v]->RunStep(actions, b.inputs, b.targets, std::nullopt,
                                                  b.segments.empty() ? nullptr : &b.segments));
          if (step >= o.warmup && rank == 0)
            ms[v].push_back(absl::ToDoubleMilliseconds(r.duration));
        }
      }
      Check("barrier", transport->Barrier(kWait));
    });
  }
  for (auto& t : threads) t.join();
  return ms;
}

// Documents as they are: Debian's fortunes (wisdom, people, science), one fortune a document,
// its bytes as tokens and `eos` after it.
std::vector<int64_t> FortuneTokens(int64_t eos) {
  std::vector<int64_t> tokens;
  for (const char* name : {"wisdom", "people", "science"}) {
    const std::string path = std::string("/usr/share/games/fortunes/") + name;
    std::ifstream in(path);
    if (!in) Check(path, absl::NotFoundError("cannot read it (Debian's fortunes packages)"));
    std::string line;
    bool open = false;
    while (std::getline(in, line)) {
      if (line == "%") {
        if (open) tokens.push_back(eos);
        open = false;
        continue;
      }
      for (unsigned char c : line) tokens.push_back(c);
      tokens.push_back('\n');
      open = true;
    }
    if (open) tokens.push_back(eos);
  }
  return tokens;
}

// `steps` batches of one mode over the fortunes: fixed windows of seq + 1 tokens at random
// starts (documents cut and run together), or rows of documents (pad, pack) as the workers make
// them (document_rows.h), each microbatch cut to its longest row.
std::vector<Batch> FortuneBatches(const std::vector<int64_t>& tokens, int64_t eos,
                                  const std::string& mode, const Options& o, int steps) {
  std::vector<Batch> out;
  const std::vector<rt::DocumentSpan> docs = rt::SplitDocuments(tokens, eos);
  for (int k = 0; k < steps; ++k) {
    rt::Batch rows;
    if (mode == "windows") {
      torch::manual_seed(100 + k);
      const torch::Tensor starts = torch::randint(
          0, static_cast<int64_t>(tokens.size()) - o.seq - 1, {o.batch}, torch::kInt64);
      rows.inputs = torch::empty({o.batch, o.seq}, torch::kInt64);
      rows.targets = torch::empty({o.batch, o.seq}, torch::kInt64);
      for (int64_t r = 0; r < o.batch; ++r) {
        const int64_t s = starts[r].item<int64_t>();
        for (int64_t i = 0; i < o.seq; ++i) {
          rows.inputs[r][i] = tokens[s + i];
          rows.targets[r][i] = tokens[s + i + 1];
        }
      }
    } else {
      rows = rt::DocumentRows(tokens, docs, eos, mode == "pack", o.batch, o.seq, 7, k);
    }
    Batch b;
    b.inputs = torch::tensor_split(rows.inputs, o.microbatches, 0);
    b.targets = torch::tensor_split(rows.targets, o.microbatches, 0);
    if (rows.segments.defined()) b.segments = torch::tensor_split(rows.segments, o.microbatches, 0);
    if (rows.row_lengths.defined()) {
      const auto lengths = torch::tensor_split(rows.row_lengths, o.microbatches, 0);
      for (int mb = 0; mb < o.microbatches; ++mb) {
        b.inputs[mb] = rt::TrimToLongestRow(b.inputs[mb], lengths[mb]);
        b.targets[mb] = rt::TrimToLongestRow(b.targets[mb], lengths[mb]);
        if (!b.segments.empty()) b.segments[mb] = rt::TrimToLongestRow(b.segments[mb], lengths[mb]);
      }
    }
    for (const torch::Tensor& t : b.targets) {
      b.positions += t.numel();
      b.counted += rt::CountedTokens(t);
    }
    out.push_back(std::move(b));
  }
  return out;
}

// Section 3: tokens counted per second and padding waste on the fortunes, windows vs pad vs pack.
void PrintFortunes(const Options& base) {
  Options o = base;
  o.vocab = 257;  // bytes and the EOS
  const int64_t eos = 256;
  const std::vector<int64_t> tokens = FortuneTokens(eos);
  const std::vector<rt::DocumentSpan> docs = rt::SplitDocuments(tokens, eos);
  std::vector<double> lengths;
  for (const rt::DocumentSpan& d : docs) lengths.push_back(static_cast<double>(d.end - d.begin));
  std::printf(
      "\n3. Documents as they are: %zu fortunes (wisdom, people, science), bytes as tokens, "
      "median %.0f tokens, 90th percentile %.0f; window seq %ld; ZBVZeroBubble\n",
      docs.size(), Median(lengths),
      [&] {
        std::sort(lengths.begin(), lengths.end());
        return lengths[lengths.size() * 9 / 10];
      }(),
      o.seq);
  std::printf("   %-8s %10s %14s %12s %14s\n", "rows", "step_ms", "counted/step", "padding",
              "tokens/s");
  const int steps = o.warmup + o.steps;
  const std::vector<std::string> modes = {"windows", "pad", "pack"};
  std::vector<std::vector<Batch>> batches;
  for (const std::string& mode : modes)
    batches.push_back(FortuneBatches(tokens, eos, mode, o, steps));
  const auto ms = Measure(sched::ScheduleKind::kZBVZeroBubble, o,
                          {Shapes::kFixed, Shapes::kFramed, Shapes::kFramed}, batches);
  for (size_t v = 0; v < modes.size(); ++v) {
    int64_t counted = 0, positions = 0;
    for (const Batch& b : batches[v]) {
      counted += b.counted;
      positions += b.positions;
    }
    const double per_step = static_cast<double>(counted) / batches[v].size();
    std::printf("   %-8s %10.1f %14.0f %11.1f%% %14.0f\n", modes[v].c_str(), Median(ms[v]),
                per_step, 100.0 * (1.0 - static_cast<double>(counted) / positions),
                per_step / Median(ms[v]) * 1e3);
  }
}

// Part 1: full windows with shapes fixed, and varying with the header framed or ahead.
void PrintHeaderCost(const Options& o, const std::vector<Batch>& full) {
  std::printf(
      "1. The shape header's cost: full windows, shapes fixed vs varying (header framed "
      "with the value, or ahead of it)\n");
  std::printf("   %-16s %10s %10s %10s %12s %12s\n", "schedule", "fixed_ms", "framed_ms",
              "ahead_ms", "framed_ratio", "ahead_ratio");
  using K = sched::ScheduleKind;
  for (K kind : {K::k1F1B, K::kInterleaved1F1B, K::kZBVZeroBubble}) {
    const auto ms =
        Measure(kind, o, {Shapes::kFixed, Shapes::kFramed, Shapes::kAhead}, {full, full, full});
    std::vector<double> framed, ahead;
    for (size_t i = 0; i < ms[0].size(); ++i) {
      framed.push_back(ms[1][i] / ms[0][i]);
      ahead.push_back(ms[2][i] / ms[0][i]);
    }
    std::printf("   %-16s %10.1f %10.1f %10.1f %12.3f %12.3f\n",
                std::string(sched::ScheduleKindName(kind)).c_str(), Median(ms[0]), Median(ms[1]),
                Median(ms[2]), Median(framed), Median(ahead));
  }
}

// Part 2: ragged microbatches, each padded to its longest row, against full windows.
void PrintRaggedSteps(const Options& o, const std::vector<Batch>& full,
                      const std::vector<Batch>& ragged) {
  using K = sched::ScheduleKind;
  int64_t ragged_positions = 0;
  for (const Batch& b : ragged) ragged_positions += b.positions;
  const double mean_ragged = static_cast<double>(ragged_positions) / ragged.size();
  std::printf(
      "\n2. Ragged steps: each microbatch padded to its longest row (lengths 1..%ld uniform), "
      "%.0f positions a step on average against %ld for full windows\n",
      o.seq, mean_ragged, o.batch * o.seq);
  std::printf("   %-16s %10s %10s %14s %14s\n", "schedule", "full_ms", "ragged_ms", "full_pos/s",
              "ragged_pos/s");
  for (K kind : {K::k1F1B, K::kZBVZeroBubble}) {
    const auto ms = Measure(kind, o, {Shapes::kFixed, Shapes::kFramed}, {full, ragged});
    std::printf("   %-16s %10.1f %10.1f %14.0f %14.0f\n",
                std::string(sched::ScheduleKindName(kind)).c_str(), Median(ms[0]), Median(ms[1]),
                o.batch * o.seq / Median(ms[0]) * 1e3, mean_ragged / Median(ms[1]) * 1e3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Ragged batches through the pipeline: the shape header's cost, ragged steps"};
  Options o;
  app.add_option("--d-model", o.d_model)->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers)->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads)->check(CLI::PositiveNumber);
  app.add_option("--seq", o.seq)->check(CLI::PositiveNumber);
  app.add_option("--vocab", o.vocab)->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "rows per step")->check(CLI::PositiveNumber);
  app.add_option("--microbatches", o.microbatches)->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "measured steps per variant")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--parts", o.parts,
                 "which parts to run: 1 header cost, 2 ragged steps, 3 documents");
  CLI11_PARSE(app, argc, argv);
  if (o.batch % o.microbatches != 0) {
    std::fprintf(stderr, "--batch must be a multiple of --microbatches\n");
    return 2;
  }
  torch::set_num_threads(1);
  std::printf(
      "ragged_bench: GPT d_model %ld, %ld blocks, %ld heads, seq %ld, vocab %ld; batch %ld rows "
      "in %d microbatches; %d ranks as threads over Gloo (loopback), 1 LibTorch thread each, "
      "pinned with a 0.1 ms time slice where the CPUs allow; "
      "%d warm-up + %d measured steps per variant, alternating; medians\n\n",
      o.d_model, o.layers, o.heads, o.seq, o.vocab, o.batch, o.microbatches, kRanks, o.warmup,
      o.steps);
  const std::vector<Batch> full = {MakeBatch(o, false, 1), MakeBatch(o, false, 2)};
  std::vector<Batch> ragged;
  for (int k = 0; k < 4; ++k) ragged.push_back(MakeBatch(o, true, 10 + k));

  if (o.parts.find('1') != std::string::npos) PrintHeaderCost(o, full);
  if (o.parts.find('2') != std::string::npos) PrintRaggedSteps(o, full, ragged);
  if (o.parts.find('3') != std::string::npos) PrintFortunes(o);
  return 0;
}
