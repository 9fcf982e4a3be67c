// Measures the pipeline runtime end to end on CPU: ranks are threads of this process, each a
// PipelineExecutor over real Gloo on loopback (InMemoryStore rendezvous) running MLP stages
// (BuildMlpStage) and its lowered list from BuildSchedule, every rank on one LibTorch thread.
//
//   1. Pipeline efficiency: the measured step time of 1F1B, Interleaved1F1B and ZBVZeroBubble
//      (and GPipe, for section 3) against the simulator's makespan fed with the per-action costs
//      and link figures measured here, and where each rank's time goes.
//   2. Split backward: B against I + W (SplitBackward) on one stage, with glibc malloc's default
//      thresholds and with them raised (mallopt), with page-fault counts.
//   3. Speed-up: the same model and batch trained on one thread without a pipeline (plain
//      LibTorch) against 1F1B and GPipe on two ranks. The ranks compute weight gradients
//      straight into .grad (fused_weight_grad.h) and plain LibTorch does not, so the
//      efficiency against the ideal can pass 1.
//   4. --trace FILE writes one measured step of --trace-schedule as a Chrome trace.
//
// Times are milliseconds; figures are medians over the measured steps (or repetitions). A
// pipelined step is timed by StepResult.duration (RunStep: from its start to the completion of
// its last send); zero_grad, a barrier and the optimizer step lie outside it, and the
// single-thread reference is timed the same way (forward and backward of every microbatch).
// The machine's other processes distort every figure: the last line says how busy they kept it.
//
//   build/bench/pipeline_bench [--width N] [--layers N] [--batch N] [--microbatches N]
//                              [--steps N] [--warmup N] [--repetitions N]
//                              [--trace FILE] [--trace-schedule KIND] [--malloc-tuning]
//                              [--count-memory]
#include <sys/resource.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "common/schedule/build.h"
#include "common/schedule/chrome_trace.h"
#include "common/schedule/simulator.h"
#include "common/process/malloc_tuning.h"
#include "worker/model/mlp.h"
#include "worker/runtime/device/compute_slice.h"
#include "worker/runtime/device/compute_threads.h"
#include "worker/runtime/device/counting_allocator.h"
#include "worker/runtime/device/cpu_pinning.h"
#include "worker/runtime/executor/fused_weight_grad.h"
#include "worker/runtime/executor/pipeline_executor.h"
#include "worker/runtime/executor/split_backward.h"
#include "worker/runtime/executor/training_setup.h"
#include "worker/runtime/data/training_data.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace rt = stagecoach::runtime;
namespace sched = stagecoach::schedule;
namespace tr = stagecoach::transport;

namespace {

using stagecoach::bench::Check;
using stagecoach::bench::Fail;
using stagecoach::bench::Median;
using stagecoach::bench::Value;

constexpr absl::Duration kWait = absl::Seconds(120);
constexpr int kRanks = 2;

struct Options {
  int width = 1024;
  int layers = 8;
  int batch = 512;
  int microbatches = 8;
  int steps = 10;
  int warmup = 2;
  int repetitions = 20;
  std::string trace_file;
  std::string trace_schedule = "ZBVZeroBubble";
  bool malloc_tuning = false;
  bool count_memory = false;
  bool unpinned = false;
};

// Whether rank threads run unpinned, with the kernel's time slice (--unpinned).
bool g_unpinned = false;

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

// CPU time of the whole machine and of this process, in clock ticks, to tell how much of the
// machine other processes took while the bench ran (they distort every figure here).
struct CpuSample {
  long long machine_busy = 0, machine_total = 0, self = 0;
  int cpus = 0;
};

CpuSample SampleCpu() {
  CpuSample sample;
  std::ifstream stat("/proc/stat");
  std::string cpu;
  stat >> cpu;
  for (int field = 0; field < 8; ++field) {  // user nice system idle iowait irq softirq steal
    long long ticks = 0;
    stat >> ticks;
    sample.machine_total += ticks;
    if (field != 3 && field != 4) sample.machine_busy += ticks;
  }
  std::ifstream self("/proc/self/stat");
  std::string line;
  std::getline(self, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));  // fields from 3 (state) on
  std::string field;
  long long utime = 0, stime = 0;
  for (int index = 3; index <= 15 && rest >> field; ++index) {
    if (index == 14) utime = std::stoll(field);
    if (index == 15) stime = std::stoll(field);
  }
  sample.self = utime + stime;
  for (std::getline(stat, line); std::getline(stat, line);) {
    if (line.size() > 3 && line.compare(0, 3, "cpu") == 0 && std::isdigit(line[3])) ++sample.cpus;
  }
  return sample;
}

// Average number of cores other processes kept busy between `start` and now.
double OtherProcessesCores(const CpuSample& start) {
  const CpuSample now = SampleCpu();
  const double wall = (now.machine_total - start.machine_total) / std::max(1, now.cpus);
  if (wall <= 0) return 0;
  return std::max(
      0.0, static_cast<double>((now.machine_busy - start.machine_busy) - (now.self - start.self)) /
               wall);
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

long ThreadMinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

stagecoach::spec::BuiltinModel Mlp(int width, int layers) {
  stagecoach::spec::BuiltinModel model;
  model.family = "mlp";
  model.sizes.assign(layers + 1, width);
  model.seed = 1;
  return model;
}

// One step's synthetic batch, split into microbatches (the same for every step).
struct Data {
  std::vector<torch::Tensor> inputs;
  std::vector<torch::Tensor> targets;
};

Data MakeData(const Options& o) {
  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({o.batch, o.width});
  const torch::Tensor y = torch::randn({o.batch, o.width});
  return Data{rt::SplitMicrobatches(x, o.microbatches), rt::SplitMicrobatches(y, o.microbatches)};
}

// Runs fn(rank, transport) on `world` threads, each with its own Gloo endpoint and computing on
// one LibTorch thread (OpenBLAS is the OpenMP build: its thread count is per calling thread).
// As a worker's tasks, each rank thread is pinned where the worker's policy would pin `world`
// ranks on one host (ChooseComputeCpus, cpu_pinning.h) and then asks for a short time slice
// (compute_slice.h), unless --unpinned.
void RunRanks(int world, const std::function<void(int, tr::Transport&)>& fn) {
  tr::InMemoryStore store;
  std::vector<std::thread> threads;
  rt::PinningInputs pinning;
  pinning.enabled = !g_unpinned;
  pinning.affinity = rt::AffinityMask();
  pinning.quota = rt::ReadCpuAllowance().quota_cpus.has_value();
  pinning.ranks_on_host = world;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      rt::PinningInputs mine = pinning;
      mine.index_on_host = rank;
      const rt::PinningChoice choice = rt::ChooseComputeCpus(mine);
      if (!choice.cpus.empty()) {
        Check("pinning rank " + std::to_string(rank), rt::PinCallingThread(choice.cpus));
        rt::RequestTimeSlice(rt::kComputeTimeSlice);
      }
      torch::set_num_threads(1);
      tr::GlooOptions options;
      options.rank = rank;
      options.world_size = world;
      options.key_prefix = "bench/";
      std::unique_ptr<tr::Transport> transport = Value("connecting rank " + std::to_string(rank),
                                                       tr::CreateGlooTransport(options, &store));
      fn(rank, *transport);
    });
  }
  for (std::thread& t : threads) t.join();
}

// ---------------------------------------------------------------------------------------------
// Link: what a message costs between two ranks, for the simulator.

struct Link {
  double latency_ms = 0;     // one way, 4-byte message
  double bytes_per_ms = 0;   // from a 16 MiB message: bytes / (one way - latency)
  double message_bytes = 0;  // one activation (= one gradient) message
  double message_ms = 0;     // one way, one activation, measured
};

// One-way time of a `bytes` message: half the median round trip (rank 0 -> 1 -> 0).
double OneWayMs(int64_t bytes, int iterations) {
  constexpr int kUntimed = 3;
  std::vector<double> round_trips;
  RunRanks(2, [&](int rank, tr::Transport& t) {
    std::vector<char> out(bytes, 1), in(bytes, 0);
    const int peer = 1 - rank;
    for (int i = 0; i < kUntimed + iterations; ++i) {
      const absl::Time start = absl::Now();
      if (rank == 0) {
        auto recv = Value("posting a receive", t.Recv(in.data(), bytes, peer, 2));
        auto send = Value("posting a send", t.Send(out.data(), bytes, peer, 1));
        Check("sending", send->Wait(kWait));
        Check("receiving", recv->Wait(kWait));
        if (i >= kUntimed) round_trips.push_back(Ms(absl::Now() - start));
      } else {
        auto recv = Value("posting a receive", t.Recv(in.data(), bytes, peer, 1));
        Check("receiving", recv->Wait(kWait));
        auto send = Value("posting a send", t.Send(out.data(), bytes, peer, 2));
        Check("sending", send->Wait(kWait));
      }
    }
  });
  return Median(round_trips) / 2;
}

Link MeasureLink(const Options& o) {
  constexpr int64_t kBulkBytes = int64_t{16} << 20;
  Link link;
  link.latency_ms = OneWayMs(4, 200);
  link.bytes_per_ms = kBulkBytes / std::max(1e-3, OneWayMs(kBulkBytes, 10) - link.latency_ms);
  link.message_bytes = static_cast<double>(o.batch / o.microbatches) * o.width * sizeof(float);
  link.message_ms = OneWayMs(static_cast<int64_t>(link.message_bytes), 50);
  return link;
}

// ---------------------------------------------------------------------------------------------
// Pipelined training over kRanks ranks.

struct PipelineRun {
  std::string name;
  sched::BuiltSchedule built;
  int num_stages = 0;
  int num_microbatches = 0;
  // results[r][k]: rank r's k-th measured step; faults[r][k]: the minor page faults of rank r's
  // thread during it.
  std::vector<std::vector<rt::StepResult>> results;
  std::vector<std::vector<double>> faults;

  int steps() const { return static_cast<int>(results[0].size()); }
  // Slowest rank's duration of measured step k.
  double StepMs(int k) const {
    double ms = 0;
    for (const auto& rank : results) ms = std::max(ms, Ms(rank[k].duration));
    return ms;
  }
  double MedianStepMs() const {
    std::vector<double> v;
    for (int k = 0; k < steps(); ++k) v.push_back(StepMs(k));
    return Median(v);
  }
  double MedianBubble(int rank) const {
    std::vector<double> v;
    for (const auto& r : results[rank]) v.push_back(r.bubble_ratio);
    return Median(v);
  }
};

PipelineRun RunPipeline(sched::ScheduleKind kind, int stages_per_rank, const Options& o,
                        const Data& data) {
  PipelineRun run;
  run.name = std::string(sched::ScheduleKindName(kind));
  sched::ScheduleConfig config;
  config.kind = kind;
  config.num_ranks = kRanks;
  config.stages_per_rank = stages_per_rank;
  config.num_microbatches = o.microbatches;
  run.built = Value("building " + run.name, sched::BuildSchedule(config));
  run.num_stages = sched::NumStages(config);
  run.num_microbatches = o.microbatches;
  if (o.layers % run.num_stages != 0) {
    Fail(run.name, absl::InvalidArgumentError("--layers must be a multiple of the stages (" +
                                              std::to_string(run.num_stages) + ")"));
  }
  const int per_stage = o.layers / run.num_stages;
  const auto model = Mlp(o.width, o.layers);
  run.results.resize(kRanks);
  run.faults.resize(kRanks);

  RunRanks(kRanks, [&](int rank, tr::Transport& transport) {
    std::vector<std::unique_ptr<stagecoach::model::StageModel>> owned;
    std::map<int, stagecoach::model::StageModel*> stages;
    std::vector<torch::Tensor> parameters;
    for (int s = 0; s < run.num_stages; ++s) {
      if (run.built.stage_to_rank[s] != rank) continue;
      owned.push_back(
          Value("building stage " + std::to_string(s),
                stagecoach::model::BuildMlpStage(model, s * per_stage, (s + 1) * per_stage)));
      stages[s] = owned.back().get();
      for (const torch::Tensor& p : owned.back()->Parameters()) parameters.push_back(p);
    }
    stagecoach::spec::OptimizerSpec sgd;
    sgd.kind = "sgd";
    sgd.lr = 1e-3;
    auto optimizer = Value("optimizer", rt::MakeOptimizer(sgd, parameters));

    rt::ExecutorOptions options;
    options.rank = rank;
    options.num_stages = run.num_stages;
    options.num_microbatches = o.microbatches;
    options.stage_to_rank = run.built.stage_to_rank;
    options.comm_timeout = kWait;
    options.loss = rt::LossKind::kMse;
    rt::PipelineExecutor executor(options, &transport, stages);
    std::vector<sched::Action> actions;
    for (const auto& a : run.built.lowered[rank]) {
      if (a.has_value()) actions.push_back(*a);
    }
    std::vector<rt::TensorMeta> first_inputs;
    for (const torch::Tensor& x : data.inputs)
      first_inputs.push_back({x.sizes().vec(), x.scalar_type()});
    Check("agreeing shapes", executor.AgreeShapes(first_inputs));

    for (int step = 0; step < o.warmup + o.steps; ++step) {
      optimizer->zero_grad();
      Check("barrier", transport.Barrier(kWait));  // every rank starts the step together
      const long faults = ThreadMinorFaults();
      rt::StepResult result = Value(run.name + " rank " + std::to_string(rank),
                                    executor.RunStep(actions, data.inputs, data.targets));
      const double step_faults = static_cast<double>(ThreadMinorFaults() - faults);
      optimizer->step();
      if (step >= o.warmup) {
        run.results[rank].push_back(std::move(result));
        run.faults[rank].push_back(step_faults);
      }
    }
  });
  return run;
}

// Per stage, the median own work (end - start - wait) of each compute type, in ms; 0 when the
// schedule has no such action.
struct StageCost {
  double f = 0, b = 0, i = 0, w = 0;
};

struct MeasuredCosts {
  std::vector<StageCost> stages;
  double reduce_grad = 0;
};

MeasuredCosts MeasureCosts(const PipelineRun& run) {
  std::vector<std::map<sched::ActionType, std::vector<double>>> samples(run.num_stages);
  std::vector<double> reduce;
  for (const auto& rank : run.results) {
    for (const rt::StepResult& step : rank) {
      for (size_t k = 0; k < step.executed.size(); ++k) {
        const sched::Action a = Value("parsing", sched::ParseRequiredAction(step.executed[k]));
        const rt::ActionTiming& t = step.timings[k];
        if (a.type == sched::ActionType::kReduceGrad) {
          reduce.push_back(Ms(t.end - t.start));
        } else if (sched::IsLeafCompute(a.type)) {
          samples[a.stage][a.type].push_back(Ms(t.end - t.start - t.wait));
        }
      }
    }
  }
  MeasuredCosts costs;
  costs.reduce_grad = Median(reduce);
  for (auto& by_type : samples) {
    costs.stages.push_back({Median(by_type[sched::ActionType::kForward]),
                            Median(by_type[sched::ActionType::kFullBackward]),
                            Median(by_type[sched::ActionType::kBackwardInput]),
                            Median(by_type[sched::ActionType::kBackwardWeight])});
  }
  return costs;
}

// One measured step of every rank on one time base (ms from the earliest rank's start), as the
// simulator's types. A transfer starts once both ends are posted and, when its consumer (the F,
// B or I that needs it) blocked on it, arrives when that wait ended: `observed` holds those
// transfers' start-to-arrival times. Otherwise the arrival is unknown; it is put at the link
// model's time after the start, but no later than the consumer's start.
struct MeasuredStep {
  std::vector<std::vector<sched::TimedAction>> timeline;
  std::vector<sched::Message> messages;
  std::vector<double> observed;
};

MeasuredStep Reconstruct(const PipelineRun& run, int k, const Link& link) {
  absl::Time t0 = run.results[0][k].start;
  for (const auto& rank : run.results) t0 = std::min(t0, rank[k].start);

  struct Seen {
    double start, end, wait;
  };
  std::map<std::string, Seen> seen;  // by action string: unique within a step
  MeasuredStep out;
  out.timeline.resize(run.results.size());
  for (size_t r = 0; r < run.results.size(); ++r) {
    const rt::StepResult& step = run.results[r][k];
    const double offset = Ms(step.start - t0);
    for (size_t i = 0; i < step.executed.size(); ++i) {
      const sched::Action a = Value("parsing", sched::ParseRequiredAction(step.executed[i]));
      const rt::ActionTiming& t = step.timings[i];
      // end: when the post returned; the simulator's SEND/RECV are instants at their start.
      seen[step.executed[i]] = {offset + Ms(t.start), offset + Ms(t.end), Ms(t.wait)};
      sched::TimedAction timed{a, offset + Ms(t.start), offset + Ms(t.end)};
      if (sched::IsSendOrRecv(a.type)) timed.end = timed.start;
      out.timeline[r].push_back(timed);
    }
  }
  auto find = [&](const sched::Action& a) -> const Seen* {
    auto it = seen.find(a.ToString());
    return it == seen.end() ? nullptr : &it->second;
  };
  for (const auto& row : out.timeline) {
    for (const sched::TimedAction& sent : row) {
      const sched::Action& a = sent.action;
      if (a.type != sched::ActionType::kSendF && a.type != sched::ActionType::kSendB) continue;
      const bool forward = a.type == sched::ActionType::kSendF;
      const int to = forward ? a.stage + 1 : a.stage - 1;
      using T = sched::ActionType;
      const sched::Action recv =
          sched::Action::Make(to, forward ? T::kRecvF : T::kRecvB, a.microbatch);
      const Seen* send_post = find(a);
      const Seen* recv_post = find(recv);
      const Seen* consumer =
          find(sched::Action::Make(to, forward ? T::kForward : T::kFullBackward, a.microbatch));
      if (!forward && consumer == nullptr) {
        consumer = find(sched::Action::Make(to, T::kBackwardInput, a.microbatch));
      }
      if (send_post == nullptr || recv_post == nullptr || consumer == nullptr) continue;
      sched::Message m;
      m.send = a;
      m.recv = recv;
      m.from_rank = run.built.stage_to_rank[a.stage];
      m.to_rank = run.built.stage_to_rank[to];
      m.posted_send = send_post->start;
      m.posted_recv = recv_post->start;
      m.start = std::max(send_post->end, recv_post->end);  // both posts have returned
      if (consumer->wait > 0.01) {
        m.arrive = std::max(m.start, consumer->start + consumer->wait);
        out.observed.push_back(m.arrive - m.start);
      } else {
        m.arrive = std::max(m.start, std::min(consumer->start, m.start + link.message_ms));
      }
      m.bytes = link.message_bytes;
      out.messages.push_back(m);
    }
  }
  std::sort(out.messages.begin(), out.messages.end(),
            [](const sched::Message& a, const sched::Message& b) { return a.start < b.start; });
  return out;
}

sched::CostModel ToCostModel(const MeasuredCosts& measured, const Link& link) {
  sched::CostModel model;
  for (const StageCost& c : measured.stages) {
    sched::StageCosts s;
    s.forward = c.f;
    // A schedule has B or I and W; the missing ones are never used, fill them consistently.
    s.backward = c.b > 0 ? c.b : c.i + c.w;
    s.backward_input = c.i > 0 ? c.i : c.b / 2;
    s.backward_weight = c.w > 0 ? c.w : c.b / 2;
    model.per_stage.push_back(s);
  }
  model.reduce_grad = measured.reduce_grad;
  model.latency = link.latency_ms;
  model.bandwidth = link.bytes_per_ms;
  model.message_bytes = link.message_bytes;
  return model;
}

std::string CostCell(double ms) {
  char buf[32];
  if (ms <= 0) return "-";
  std::snprintf(buf, sizeof buf, "%.2f", ms);
  return buf;
}

sched::Simulation SimulateRun(const PipelineRun& run, const MeasuredCosts& costs,
                              const Link& link) {
  return Value("simulating " + run.name,
               sched::Simulate(run.built.lowered, run.built.stage_to_rank, run.num_stages,
                               run.num_microbatches, ToCostModel(costs, link)));
}

// Where each rank's step time goes (medians over the measured steps, ms): own compute work;
// blocked on a receive inside F/B/I/W; SEND/RECV posts; REDUCE_GRAD and UNSHARD/RESHARD;
// after the last action (waiting for sends to finish); the rest (gaps between actions).
void PrintBreakdown(const PipelineRun& run, const sched::Simulation& sim) {
  for (int r = 0; r < kRanks; ++r) {
    std::vector<double> duration, busy, wait, posts, other, tail, gaps;
    for (const rt::StepResult& step : run.results[r]) {
      double b = 0, w = 0, p = 0, o = 0, covered = 0;
      for (size_t k = 0; k < step.executed.size(); ++k) {
        const sched::Action a = Value("parsing", sched::ParseRequiredAction(step.executed[k]));
        const rt::ActionTiming& t = step.timings[k];
        const double span = Ms(t.end - t.start);
        covered += span;
        if (sched::IsCompute(a.type)) {
          b += span - Ms(t.wait);
          w += Ms(t.wait);
        } else if (sched::IsSendOrRecv(a.type)) {
          p += span;
        } else {
          o += span;
        }
      }
      const double d = Ms(step.duration);
      const double t = step.timings.empty() ? 0 : d - Ms(step.timings.back().end);
      duration.push_back(d);
      busy.push_back(b);
      wait.push_back(w);
      posts.push_back(p);
      other.push_back(o);
      tail.push_back(t);
      gaps.push_back(d - covered - t);
    }
    std::printf("   %-16s %4d %9.1f %9.1f %9.1f %9.1f %7.2f %7.2f %7.2f %7.2f %8.0f\n",
                r == 0 ? run.name.c_str() : "", r, Median(duration), Median(busy), sim.busy[r],
                Median(wait), Median(posts), Median(other), Median(tail), Median(gaps),
                Median(run.faults[r]));
  }
}

void PrintEfficiency(const std::vector<const PipelineRun*>& runs, const Link& link) {
  std::printf(
      "1. Pipeline efficiency (%d ranks): measured step vs the simulator fed with the "
      "measured costs\n",
      kRanks);
  std::printf(
      "   link (Gloo ping-pong, half the median round trip): latency %.3f ms (4 B), "
      "bandwidth %.2f GB/s (16 MiB); a %.0f KiB activation: %.3f ms measured, %.3f ms "
      "modelled\n\n",
      link.latency_ms, link.bytes_per_ms * 1e3 / 1e9, link.message_bytes / 1024, link.message_ms,
      link.latency_ms + link.message_bytes / link.bytes_per_ms);
  std::printf("   median own work per action (ms; end - start - wait)\n");
  std::printf("   %-16s %5s %4s %7s %7s %7s %7s %11s\n", "schedule", "stage", "rank", "F", "B", "I",
              "W", "REDUCE_GRAD");
  std::vector<sched::Simulation> sims;
  for (const PipelineRun* run : runs) {
    const MeasuredCosts costs = MeasureCosts(*run);
    for (int s = 0; s < run->num_stages; ++s) {
      const StageCost& c = costs.stages[s];
      std::printf("   %-16s %5d %4d %7s %7s %7s %7s %11s\n", s == 0 ? run->name.c_str() : "", s,
                  run->built.stage_to_rank[s], CostCell(c.f).c_str(), CostCell(c.b).c_str(),
                  CostCell(c.i).c_str(), CostCell(c.w).c_str(),
                  s == 0 ? CostCell(costs.reduce_grad).c_str() : "");
    }
    sims.push_back(SimulateRun(*run, costs, link));
  }
  std::printf("\n   %-16s %11s %12s %7s   %-19s %-19s\n", "schedule", "measured_ms", "simulated_ms",
              "ratio", "bubble r0 meas/sim", "bubble r1 meas/sim");
  for (size_t k = 0; k < runs.size(); ++k) {
    const PipelineRun& run = *runs[k];
    const double measured = run.MedianStepMs();
    std::printf("   %-16s %11.1f %12.1f %7.3f", run.name.c_str(), measured, sims[k].makespan,
                measured / sims[k].makespan);
    for (int r = 0; r < kRanks; ++r) {
      std::printf("   %8.3f / %-8.3f", run.MedianBubble(r), sims[k].bubble_ratio[r]);
    }
    std::printf("\n");
  }
  std::printf(
      "\n   where the time goes (ms, medians per rank): step, own compute work (measured and "
      "simulated), blocked\n   on receives inside compute, SEND/RECV posts, REDUCE_GRAD "
      "etc., after the last action, gaps; minor page faults\n   of the rank's thread per "
      "step\n");
  std::printf("   %-16s %4s %9s %9s %9s %9s %7s %7s %7s %7s %8s\n", "schedule", "rank", "step",
              "busy", "sim_busy", "blocked", "posts", "other", "tail", "gaps", "faults");
  for (size_t k = 0; k < runs.size(); ++k) PrintBreakdown(*runs[k], sims[k]);

  std::printf(
      "\n   transfers inside the pipeline: start (both posts returned) to arrival, for those "
      "whose consumer\n   blocked on them (all measured steps); and the simulation again "
      "with that median as the latency\n");
  std::printf("   %-16s %9s %8s %9s %9s %13s %7s\n", "schedule", "per_step", "blocked", "median_ms",
              "p90_ms", "simulated_ms", "ratio");
  for (size_t k = 0; k < runs.size(); ++k) {
    const PipelineRun& run = *runs[k];
    std::vector<double> observed;
    size_t per_step = 0;
    for (int step = 0; step < run.steps(); ++step) {
      const MeasuredStep measured = Reconstruct(run, step, link);
      per_step = measured.messages.size();
      observed.insert(observed.end(), measured.observed.begin(), measured.observed.end());
    }
    Link loaded = link;
    loaded.latency_ms = Median(observed);
    loaded.bytes_per_ms = 0;  // infinite: the observed time is the whole transfer
    const sched::Simulation sim = SimulateRun(run, MeasureCosts(run), loaded);
    std::printf("   %-16s %9zu %8zu %9.3f %9.3f %13.1f %7.3f\n", run.name.c_str(), per_step,
                observed.size(), Median(observed), Percentile(observed, 0.9), sim.makespan,
                run.MedianStepMs() / sim.makespan);
  }
  std::printf("\n");
}

// ---------------------------------------------------------------------------------------------
// Split backward on one stage.

// Medians of B, I and W: milliseconds and minor page faults of the calling thread.
struct SplitTimes {
  double b = 0, i = 0, w = 0;
  double b_faults = 0, i_faults = 0, w_faults = 0;
};

// Times B, I and W on one stage of `layers` layers whose input requires grad (a middle stage, so
// that I has work to do), on a fresh thread computing on one LibTorch thread, as a rank does.
// Each repetition runs a fresh forward (untimed) for B and another for I and W; gradients
// accumulate into .grad as within a step. `fuse`: B and W compute the weight gradients straight
// into .grad, as the executor does by default (worker/runtime/executor/fused_weight_grad.h).
SplitTimes TimeSplitBackward(const Options& o, int layers, bool fuse) {
  SplitTimes out;
  std::thread worker([&] {
    torch::set_num_threads(1);
    auto stage = Value("building the stage",
                       stagecoach::model::BuildMlpStage(Mlp(o.width, layers), 0, layers));
    const int64_t rows = o.batch / o.microbatches;
    torch::manual_seed(3);
    const torch::Tensor x0 = torch::randn({rows, o.width});
    const torch::Tensor grad = torch::randn({rows, o.width});
    std::vector<double> b, i, w, bf, itf, wf;
    // Times fn and counts its page faults into the samples (after two untimed repetitions).
    auto timed = [&](bool keep, std::vector<double>& ms, std::vector<double>& faults,
                     const std::function<void()>& fn) {
      const long faults_before = ThreadMinorFaults();
      const absl::Time start = absl::Now();
      fn();
      if (!keep) return;
      ms.push_back(Ms(absl::Now() - start));
      faults.push_back(static_cast<double>(ThreadMinorFaults() - faults_before));
    };
    for (int rep = 0; rep < o.repetitions + 2; ++rep) {
      const bool keep = rep >= 2;
      {  // B, the executor's way: full backward, then the input's gradient
        torch::Tensor x = x0.clone().requires_grad_(true);
        torch::Tensor y = stage->Forward(x);
        timed(keep, b, bf, [&] {
          if (fuse) rt::FuseWeightGradients(std::vector<torch::Tensor>{y});
          torch::autograd::backward({y}, {grad});
          torch::Tensor input_grad = x.grad();
        });
      }
      {  // I, then W
        torch::Tensor x = x0.clone().requires_grad_(true);
        torch::Tensor y = stage->Forward(x);
        rt::PendingWeightGrad pending;
        timed(keep, i, itf, [&] {
          torch::Tensor input_grad = rt::SplitBackward::BackwardInput({y}, {grad}, x, &pending);
        });
        timed(keep, w, wf, [&] { rt::SplitBackward::BackwardWeight(std::move(pending), fuse); });
      }
    }
    out = {Median(b), Median(i), Median(w), Median(bf), Median(itf), Median(wf)};
  });
  worker.join();
  return out;
}

void PrintSplitRow(const char* label, const SplitTimes& t) {
  std::printf("   %-26s %7.2f %7.2f %7.2f %7.2f %9.3f   %6.0f %6.0f %6.0f\n", label, t.b, t.i, t.w,
              t.i + t.w, (t.i + t.w) / t.b, t.b_faults, t.i_faults, t.w_faults);
}

void PrintSplitBackward(const Options& o, bool tuned_from_start) {
  const int layers = 4;
  std::printf(
      "2. Split backward: one stage of %d x Linear(%d,%d)+ReLU (input requires grad), "
      "microbatch %d rows,\n   median of %d; ms, and minor page faults of the thread\n",
      layers, o.width, o.width, o.batch / o.microbatches, o.repetitions);
  std::printf("   %-26s %7s %7s %7s %7s %9s   %6s %6s %6s\n", "malloc", "B", "I", "W", "I+W",
              "(I+W)/B", "flt_B", "flt_I", "flt_W");
  if (!tuned_from_start) {
    PrintSplitRow("glibc defaults", TimeSplitBackward(o, layers, /*fuse=*/false));
    stagecoach::TuneMallocForTensors();
  }
  PrintSplitRow("mallopt mmap/trim/arenas", TimeSplitBackward(o, layers, /*fuse=*/false));
  PrintSplitRow("mallopt, weight grads fused", TimeSplitBackward(o, layers, /*fuse=*/true));
  std::printf("\n");
}

// ---------------------------------------------------------------------------------------------
// Speed-up against plain LibTorch on one thread.

// Medians over the measured steps of training without a pipeline.
struct PlainStep {
  double ms = 0;
  double faults = 0;  // minor page faults of the thread per step
};

// The whole model on one thread (a fresh one, computing on one LibTorch thread, as a rank does)
// without a pipeline: for each microbatch forward, mse loss, backward of loss / m (the mean over
// microbatches). Written independently of the worker; timed like RunStep (zero_grad and the
// optimizer step outside).
PlainStep TrainWithoutPipeline(const Options& o, const Data& data) {
  PlainStep out;
  std::thread worker([&] {
    torch::set_num_threads(1);
    torch::manual_seed(1);
    std::vector<torch::nn::Linear> layers;
    std::vector<torch::Tensor> parameters;
    for (int l = 0; l < o.layers; ++l) {
      layers.emplace_back(o.width, o.width);
      for (const torch::Tensor& p : layers.back()->parameters()) parameters.push_back(p);
    }
    torch::optim::SGD optimizer(parameters, torch::optim::SGDOptions(1e-3));
    std::vector<double> times, faults;
    for (int step = 0; step < o.warmup + o.steps; ++step) {
      optimizer.zero_grad();
      const long faults_before = ThreadMinorFaults();
      const absl::Time start = absl::Now();
      double loss_sum = 0;
      for (int mb = 0; mb < o.microbatches; ++mb) {
        torch::Tensor h = data.inputs[mb];
        for (int l = 0; l < o.layers; ++l) {
          h = layers[l]->forward(h);
          if (l + 1 < o.layers) h = torch::relu(h);
        }
        torch::Tensor loss = torch::mse_loss(h, data.targets[mb]);
        loss_sum += loss.item<double>();
        (loss / o.microbatches).backward();
      }
      if (step >= o.warmup) {
        times.push_back(Ms(absl::Now() - start));
        faults.push_back(static_cast<double>(ThreadMinorFaults() - faults_before));
      }
      if (!(loss_sum >= 0)) Fail("reference", absl::InternalError("loss is not a number"));
      optimizer.step();
    }
    out = {Median(times), Median(faults)};
  });
  worker.join();
  return out;
}

// sim_T2: the simulator's makespan from section 1's inputs (measured costs and link), i.e. the
// schedule on these stages with no runtime overhead; it separates the schedule's bubbles and the
// stages' imbalance (the first stage computes no input gradient, the last one the loss) from
// the runtime's own losses.
void PrintSpeedup(const PlainStep& plain, const std::vector<const PipelineRun*>& runs,
                  const Link& link, const Options& o) {
  const double t1 = plain.ms;
  const double m = o.microbatches, p = kRanks;
  const double ideal = m * p / (m + p - 1);
  std::printf(
      "3. Speed-up: one thread without a pipeline (T1; %.0f minor page faults per step) "
      "vs %d ranks (T2)\n",
      plain.faults, kRanks);
  std::printf("   %-10s %9s %9s %9s %7s %11s %10s %12s\n", "schedule", "T1_ms", "T2_ms", "speed-up",
              "ideal", "efficiency", "sim_T2_ms", "sim_speed-up");
  for (const PipelineRun* run : runs) {
    const double t2 = run->MedianStepMs();
    const double sim = SimulateRun(*run, MeasureCosts(*run), link).makespan;
    std::printf("   %-10s %9.1f %9.1f %9.3f %7.3f %11.3f %10.1f %12.3f\n", run->name.c_str(), t1,
                t2, t1 / t2, ideal, t1 / t2 / ideal, sim, t1 / sim);
  }
  std::printf("\n");
}

// ---------------------------------------------------------------------------------------------
// Chrome trace of one measured step.

void WriteTrace(const PipelineRun& run, const Link& link, const std::string& path) {
  const MeasuredStep step = Reconstruct(run, run.steps() - 1, link);
  sched::ChromeTraceOptions options;
  options.microseconds_per_unit = 1000;  // the timeline is in ms
  options.title = "pipeline_bench " + run.name + " (measured step)";
  std::ofstream out(path);
  out << sched::FormatChromeTrace(step.timeline, step.messages, options);
  if (!out.good()) Fail("writing " + path, absl::UnknownError("write failed"));
  std::printf("4. Trace: the last measured step of %s (%zu transfers) written to %s\n",
              run.name.c_str(), step.messages.size(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Pipeline runtime on CPU: efficiency vs the simulator, split backward, speed-up"};
  Options o;
  app.add_option("--width", o.width, "MLP width (every layer width x width)")
      ->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers,
                 "MLP layers (a multiple of 4: 4 stages for the "
                 "interleaved schedules)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "rows per step")->check(CLI::PositiveNumber);
  app.add_option("--microbatches", o.microbatches, "microbatches per step (a multiple of 4)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "measured steps per schedule")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--repetitions", o.repetitions, "split-backward repetitions")
      ->check(CLI::PositiveNumber);
  app.add_option("--trace", o.trace_file, "write one measured step as a Chrome trace to FILE");
  app.add_option("--trace-schedule", o.trace_schedule, "schedule of the trace");
  app.add_flag("--malloc-tuning", o.malloc_tuning,
               "raise glibc's mmap and trim thresholds and use one arena from the start");
  app.add_flag("--unpinned", o.unpinned,
               "leave the rank threads unpinned with the kernel's time slice (a worker pins them "
               "and asks for 0.1 ms when several ranks share a machine)");
  app.add_flag("--count-memory", o.count_memory,
               "install the counting CPU allocator a worker daemon runs under (its cost: compare "
               "with a run without)");
  CLI11_PARSE(app, argc, argv);
  g_unpinned = o.unpinned;
  if (o.batch < o.microbatches) {
    std::fprintf(stderr, "--batch must be at least --microbatches\n");
    return 2;
  }
  const sched::ScheduleKind trace_kind =
      Value("--trace-schedule", sched::ParseScheduleKind(o.trace_schedule));

  const CpuSample cpu_start = SampleCpu();
  torch::set_num_threads(1);
  if (o.malloc_tuning) stagecoach::TuneMallocForTensors();
  if (o.count_memory) stagecoach::runtime::CountingCpuAllocator::Install();
  std::printf(
      "pipeline_bench: MLP %d x Linear(%d,%d)+ReLU, batch %d, %d microbatches, mse, SGD; "
      "%d ranks as threads over Gloo (loopback), 1 LibTorch thread each, %s; "
      "%d warm-up + %d measured steps, medians; malloc %s; %s\n\n",
      o.layers, o.width, o.width, o.batch, o.microbatches, kRanks,
      o.unpinned ? "unpinned" : "pinned with a 0.1 ms time slice where the CPUs allow", o.warmup,
      o.steps,
      o.malloc_tuning ? "tuned (mallopt: mmap/trim thresholds, one arena)" : "glibc defaults",
      o.count_memory ? "counting CPU allocator installed" : "LibTorch's CPU allocator");
  const Data data = MakeData(o);
  const Link link = MeasureLink(o);

  std::map<sched::ScheduleKind, PipelineRun> runs;
  auto run = [&](sched::ScheduleKind kind) -> const PipelineRun* {
    auto it = runs.find(kind);
    if (it == runs.end()) {
      it = runs.emplace(kind, RunPipeline(kind, sched::DefaultStagesPerRank(kind), o, data)).first;
    }
    return &it->second;
  };
  using K = sched::ScheduleKind;
  // 1 stage per rank for 1F1B and GPipe, 2 for the others (their defaults). GPipe is here for
  // section 3.
  PrintEfficiency({run(K::k1F1B), run(K::kInterleaved1F1B), run(K::kZBVZeroBubble), run(K::kGPipe)},
                  link);
  // The pipelines above and the speed-up below run with the malloc settings the process started
  // with; section 2 tunes malloc (unless --malloc-tuning did already) after its first row.
  const PlainStep plain = TrainWithoutPipeline(o, data);
  const std::vector<const PipelineRun*> speedup_runs = {run(K::k1F1B), run(K::kGPipe)};
  PrintSplitBackward(o, o.malloc_tuning);
  PrintSpeedup(plain, speedup_runs, link, o);
  if (!o.trace_file.empty()) WriteTrace(*run(trace_kind), link, o.trace_file);
  std::printf("other processes kept %.2f of %d cores busy on average during this run\n",
              OtherProcessesCores(cpu_start), SampleCpu().cpus);
  return 0;
}
