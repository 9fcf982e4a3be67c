// Times the schedule library's phases for every schedule kind as ranks and microbatches grow:
// generate (GenerateSchedule), lower (LowerSchedule: unshard/reshard, reduce-grad, send/recv),
// validate (ValidateComputeSchedule + ValidateLoweredSchedule) and simulate (Simulate), up to
// 64 ranks and 1024 microbatches. Prints one table per sweep and the growth exponent k of each
// phase (time ~ n^k between the smallest and largest size of the sweep), then checks the goal:
// ZBVZeroBubble at 64 ranks x 1024 microbatches generated, lowered and validated in under 1 s.
// Every figure is the median of --repeat runs.
//
//   build/bench/schedule_bench [--repeat N] [--kinds GPipe,ZBVZeroBubble]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/schedule/generators.h"
#include "common/schedule/lowering.h"
#include "common/schedule/simulator.h"
#include "common/schedule/validator.h"

namespace sched = stagecoach::schedule;

namespace {

struct PhaseTimes {
  double generate = 0, lower = 0, validate = 0, simulate = 0;  // seconds
  size_t actions = 0;                                          // in the lowered lists
  double total_without_simulate() const { return generate + lower + validate; }
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Runs every phase once; exits on any error (a benchmark of a failing run means nothing).
PhaseTimes RunOnce(sched::ScheduleKind kind, int ranks, int microbatches) {
  sched::ScheduleConfig config;
  config.kind = kind;
  config.num_ranks = ranks;
  config.stages_per_rank = sched::DefaultStagesPerRank(kind);
  config.num_microbatches = microbatches;
  const int stages = sched::NumStages(config);
  sched::ValidationOptions validation;
  validation.has_backward = sched::HasBackward(kind);
  auto fail = [&](const absl::Status& status) {
    std::fprintf(stderr, "%s r%d m%d: %s\n", std::string(sched::ScheduleKindName(kind)).c_str(),
                 ranks, microbatches, std::string(status.message()).substr(0, 400).c_str());
    std::exit(1);
  };
  PhaseTimes t;
  auto start = std::chrono::steady_clock::now();
  auto order = sched::GenerateSchedule(config);
  t.generate = Seconds(start);
  if (!order.ok()) fail(order.status());
  auto mapping = sched::StageToRank(stages, ranks, sched::DefaultMappingStyle(kind));
  if (!mapping.ok()) fail(mapping.status());

  start = std::chrono::steady_clock::now();
  auto lowered = sched::LowerSchedule(*order, *mapping, stages, microbatches);
  t.lower = Seconds(start);
  if (!lowered.ok()) fail(lowered.status());

  start = std::chrono::steady_clock::now();
  auto inferred = sched::ValidateComputeSchedule(*order, ranks, stages, microbatches, validation);
  if (!inferred.ok()) fail(inferred.status());
  absl::Status valid =
      sched::ValidateLoweredSchedule(*lowered, *mapping, stages, microbatches, validation);
  t.validate = Seconds(start);
  if (!valid.ok()) fail(valid);

  start = std::chrono::steady_clock::now();
  auto sim = sched::Simulate(*lowered, *mapping, stages, microbatches);
  t.simulate = Seconds(start);
  if (!sim.ok()) fail(sim.status());
  for (const auto& actions : *lowered) t.actions += actions.size();
  return t;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The median of each phase over `repeat` runs.
PhaseTimes Median(sched::ScheduleKind kind, int ranks, int microbatches, int repeat) {
  std::vector<double> generate, lower, validate, simulate;
  PhaseTimes t;
  for (int i = 0; i < repeat; ++i) {
    t = RunOnce(kind, ranks, microbatches);
    generate.push_back(t.generate);
    lower.push_back(t.lower);
    validate.push_back(t.validate);
    simulate.push_back(t.simulate);
  }
  t.generate = Median(generate);
  t.lower = Median(lower);
  t.validate = Median(validate);
  t.simulate = Median(simulate);
  return t;
}

double Exponent(double t0, double t1, double n0, double n1) {
  if (t0 <= 0 || t1 <= 0) return 0;
  return std::log(t1 / t0) / std::log(n1 / n0);
}

void PrintRow(const char* label, int value, const PhaseTimes& t) {
  std::printf("  %-13s %5d %10zu %9.2f %9.2f %9.2f %9.2f %9.2f\n", label, value, t.actions,
              t.generate * 1e3, t.lower * 1e3, t.validate * 1e3, t.simulate * 1e3,
              t.total_without_simulate() * 1e3);
}

void PrintGrowth(const PhaseTimes& a, const PhaseTimes& b, double n0, double n1) {
  std::printf("  %-13s %5s %10.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", "growth k", "",
              Exponent(a.actions, b.actions, n0, n1), Exponent(a.generate, b.generate, n0, n1),
              Exponent(a.lower, b.lower, n0, n1), Exponent(a.validate, b.validate, n0, n1),
              Exponent(a.simulate, b.simulate, n0, n1),
              Exponent(a.total_without_simulate(), b.total_without_simulate(), n0, n1));
}

void PrintHeader(const char* what) {
  std::printf("  %-13s %5s %10s %9s %9s %9s %9s %9s\n", what, "", "actions", "gen ms", "lower ms",
              "valid ms", "sim ms", "g+l+v ms");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"schedule library benchmark"};
  int repeat = 5;
  std::string kinds_flag;
  app.add_option("--repeat", repeat, "runs per point; the median is reported (default 5)");
  app.add_option("--kinds", kinds_flag, "comma-separated schedule names (default: all)");
  CLI11_PARSE(app, argc, argv);

  std::vector<sched::ScheduleKind> kinds = sched::AllScheduleKinds();
  if (!kinds_flag.empty()) {
    kinds.clear();
    for (absl::string_view name : absl::StrSplit(kinds_flag, ',')) {
      auto kind = sched::ParseScheduleKind(name);
      if (!kind.ok()) {
        std::fprintf(stderr, "%s\n", std::string(kind.status().message()).c_str());
        return 2;
      }
      kinds.push_back(*kind);
    }
  }
  const std::vector<int> microbatch_sweep = {128, 256, 512, 1024};
  const std::vector<int> rank_sweep = {8, 16, 32, 64};
  double zbv_goal = -1;
  for (sched::ScheduleKind kind : kinds) {
    std::printf("%s (%d stage%s per rank)\n", std::string(sched::ScheduleKindName(kind)).c_str(),
                sched::DefaultStagesPerRank(kind),
                sched::DefaultStagesPerRank(kind) == 1 ? "" : "s");
    PrintHeader("64 ranks, m =");
    std::vector<PhaseTimes> by_m;
    for (int m : microbatch_sweep) {
      by_m.push_back(Median(kind, 64, m, repeat));
      PrintRow("", m, by_m.back());
    }
    PrintGrowth(by_m.front(), by_m.back(), microbatch_sweep.front(), microbatch_sweep.back());
    PrintHeader("m 1024, r =");
    std::vector<PhaseTimes> by_r;
    for (int r : rank_sweep) {
      by_r.push_back(r == 64 ? by_m.back() : Median(kind, r, 1024, repeat));
      PrintRow("", r, by_r.back());
    }
    PrintGrowth(by_r.front(), by_r.back(), rank_sweep.front(), rank_sweep.back());
    std::printf("\n");
    if (kind == sched::ScheduleKind::kZBVZeroBubble)
      zbv_goal = by_m.back().total_without_simulate();
  }
  if (zbv_goal >= 0) {
    std::printf(
        "goal: ZBVZeroBubble, 64 ranks x 1024 microbatches, generate+lower+validate = "
        "%.0f ms (target < 1000 ms): %s\n",
        zbv_goal * 1e3, zbv_goal < 1.0 ? "met" : "MISSED");
  }
  return 0;
}
