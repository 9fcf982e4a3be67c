// Stagecoach against PyTorch's own pipelining runtime (torch.distributed.pipelining) on one job:
// the same TorchScript MLP, weights and data file, the same batch, microbatches, loss (mse) and
// optimizer (SGD), 2 ranks with --threads compute threads each. Stagecoach runs through its
// daemons (a coordinator and 2 workers on loopback, tests/support/local_cluster); PyTorch runs
// bench/peer/torch_pipelining.py, 2 processes over gloo. For every schedule both have, the two
// alternate over --rounds rounds; the table gives each side's median step, its spread (p90/p50
// over the measured steps of every round, and the median over rounds of each round's own
// p90/p50, which leaves out the machine's drift between rounds) and the ratio PyTorch ÷
// Stagecoach (above 1: we are faster), and the largest difference of their per-step losses.
//
// A step's time is the slowest rank's own step on both sides: Stagecoach's step_time_seconds
// (from each rank's step start to its last send and optimizer step), PyTorch's from the start of
// schedule.step() to the end of opt.step() on each rank; no barrier inside either.
//
// PyTorch 2.4-2.6 on gloo needs workarounds to run most schedules (torch_pipelining.py's
// docstring lists them); the table runs PyTorch with them, and the last column says what PyTorch
// does as shipped (--shipped-steps steps, --shipped-timeout each; --shipped-steps 0 skips it).
//
// PyTorch comes from --torch-root, a chroot with PyTorch >= 2.4 (scripts/trixie_chroot.sh makes
// one: Debian 12's 1.13 has no pipelining), or, with --torch-root '', from --python on this host.
//
// --stacks says which Stagecoach builds run: "host" (this build, on this machine's LibTorch and
// BLAS), "root" (the build --root-build inside --torch-root, which scripts/test_trixie.sh makes:
// the same LibTorch and BLAS as PyTorch, so that only the runtimes differ), or "host,root". Each
// stack gets its own row per schedule, and every stack and PyTorch alternate within a round.
// --model big (the default) is bench_mlp.pt, 8 x (Linear(1024, 1024), ReLU); --model tiny is
// bench_tiny_mlp.pt, the same at width 16, whose step time is each runtime's own overhead. Both
// come from tests/models/make_models.py --bench, run with /usr/bin/python3 (any PyTorch).
//
//   sudo scripts/trixie_chroot.sh /var/tmp/stagecoach-trixie
//   sudo build/bench/peer_bench [--model big|tiny|FILE] [--schedules 1F1B,ZBVZeroBubble]
//        [--rounds 3] [--steps 20] [--warmup 4] [--batch 256] [--microbatches 8] [--threads 1]
//        [--stacks host|root|host,root] [--root-build /build-trixie]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "bench/cluster_runs.h"
#include "nlohmann/json.hpp"
#include "tests/support/local_cluster.h"
#include "tests/support/process.h"

namespace sc = stagecoach;
using nlohmann::json;

namespace {

struct Options {
  std::string torch_root = "/var/tmp/stagecoach-trixie";
  std::string python = "/usr/bin/python3";
  std::string model = "big";
  std::string schedules =
      "GPipe,1F1B,Interleaved1F1B,LoopedBFS,InterleavedZeroBubble,ZBVZeroBubble";
  int rounds = 3, steps = 20, warmup = 4, batch = 256, microbatches = 8, threads = 1;
  int shipped_steps = 4, shipped_timeout = 30;
  double lr = 0.01;
  std::string log_level = "info";
  std::string stacks = "host";
  std::string root_build = "/build-trixie";
};

// One run's measured steps (after the warmup) and every step's loss.
struct Run {
  std::vector<double> times, losses;
};

// One Stagecoach build and its daemons.
struct Stack {
  std::string name;  // "host" or "root"
  std::unique_ptr<sc::testing::LocalCluster> cluster;
  std::string work;  // the work directory as its daemons see it
};

struct Row {
  std::string schedule;
  std::vector<std::vector<double>> ours;  // per stack: measured steps of every round
  std::vector<double> theirs;             // measured steps of every round
  // p90/p50 of each round's own steps (per stack, and PyTorch's): the runtime's jitter without
  // the machine's drift between rounds.
  std::vector<std::vector<double>> ours_round_spreads;
  std::vector<double> theirs_round_spreads;
  std::vector<double> max_loss_diff;  // per stack, against PyTorch's
  std::string shipped = "not run";
  json torch_info;
};

bool IsMulti(const std::string& schedule) { return schedule != "GPipe" && schedule != "1F1B"; }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::lround(q * (v.size() - 1)))];
}

double Spread(const std::vector<double>& times) {
  const double median = sc::bench::Median(times);
  return median > 0 ? Quantile(times, 0.9) / median : 0;
}

// The command prefix that runs a program inside the chroot `root` (Debian's torch has no libuv).
std::vector<std::string> InChroot(const std::string& root) {
  return {"/usr/sbin/chroot", root, "/usr/bin/env", "USE_LIBUV=0"};
}

// Runs torch_pipelining.py with `args` (paths in them as the host sees them under the root).
class TorchSide {
 public:
  TorchSide(const Options& o, std::string work) : o_(o), work_(std::move(work)) {}

  // The path PyTorch's process sees for the host path `host`.
  std::string Inside(const std::string& host) const {
    return o_.torch_root.empty() ? host : host.substr(o_.torch_root.size());
  }

  json Call(std::vector<std::string> args, int timeout_s) const {
    std::vector<std::string> argv;
    if (!o_.torch_root.empty()) {
      argv = InChroot(o_.torch_root);
      argv.insert(argv.end(), {"GLOO_SOCKET_IFNAME=lo", "python3"});
    } else {
      argv = absl::StrSplit(o_.python, ' ', absl::SkipEmpty());
    }
    argv.push_back(Inside(work_ + "/torch_pipelining.py"));
    argv.insert(argv.end(), args.begin(), args.end());
    sc::testing::CommandResult r = sc::testing::RunCommand(argv, absl::Seconds(timeout_s + 60));
    if (r.exit_code != 0) {
      sc::bench::Fail(absl::StrJoin(argv, " "),
                      absl::InternalError(absl::StrCat("exit ", r.exit_code, ": ", r.err)));
    }
    if (args[0] == "data") return json::object();
    // The result is the last line of stdout.
    absl::string_view text = absl::StripTrailingAsciiWhitespace(r.out);
    const size_t line = text.rfind('\n');
    json out =
        json::parse(line == absl::string_view::npos ? text : text.substr(line + 1), nullptr, false);
    if (!out.is_object()) sc::bench::Fail("torch_pipelining.py", absl::InternalError(r.out));
    return out;
  }

  // A run with the workarounds: the measured steps (slowest rank per step) and losses.
  Run Measure(const std::string& schedule, json* info) const {
    json out = Call(RunArgs(schedule, "workarounds", o_.steps, 600), 600);
    if (out.contains("error")) {
      sc::bench::Fail(
          "PyTorch " + schedule,
          absl::InternalError(out["error"].get<std::string>() + "\n" + out.value("traceback", "")));
    }
    Run run;
    run.times = SlowestRankPerStep(out, o_.warmup, o_.steps);
    run.losses = out["losses"].get<std::vector<double>>();
    out.erase("rank_times");
    out.erase("losses");
    *info = out;
    return run;
  }

  // What PyTorch does as shipped: "runs, p50 X ms" or its error.
  std::string Shipped(const std::string& schedule) const {
    json out = Call(RunArgs(schedule, "shipped", o_.shipped_steps, o_.shipped_timeout),
                    o_.shipped_timeout);
    if (out.contains("error")) return out["error"].get<std::string>().substr(0, 90);
    const std::vector<double> slowest = SlowestRankPerStep(out, 0, o_.shipped_steps);
    return absl::StrCat("runs (sum of gradients), median ",
                        absl::StrFormat("%.1f", 1e3 * sc::bench::Median(slowest)), " ms");
  }

 private:
  // Steps [from, to) of a run's "rank_times": each step's slowest rank.
  static std::vector<double> SlowestRankPerStep(const json& out, int from, int to) {
    std::vector<double> slowest;
    for (int s = from; s < to; ++s) {
      double m = 0;
      for (const auto& [rank, times] : out["rank_times"].items()) {
        m = std::max(m, times[s].get<double>());
      }
      slowest.push_back(m);
    }
    return slowest;
  }

  std::vector<std::string> RunArgs(const std::string& schedule, const std::string& mode, int steps,
                                   int timeout) const {
    return {"run",
            "--model",
            Inside(work_ + "/model.pt"),
            "--data",
            Inside(work_ + "/data.pt"),
            "--schedule",
            schedule,
            "--mode",
            mode,
            "--batch",
            absl::StrCat(o_.batch),
            "--microbatches",
            absl::StrCat(o_.microbatches),
            "--steps",
            absl::StrCat(steps),
            "--lr",
            absl::StrCat(o_.lr),
            "--threads",
            absl::StrCat(o_.threads),
            "--timeout",
            absl::StrCat(timeout)};
  }

  const Options& o_;
  std::string work_;
};

// The same job through Stagecoach's daemons; `work` as they see it.
Run MeasureOurs(sc::testing::LocalCluster& c, const Options& o, const std::string& work,
                const std::string& schedule) {
  const std::string spec = absl::StrCat(
      "name: peer-", absl::AsciiStrToLower(schedule), "\nmodel: {torchscript: ", work,
      "/model.pt}\nsplit: {stages: ", IsMulti(schedule) ? 4 : 2, "}\nschedule: {kind: ", schedule,
      ", microbatches: ", o.microbatches,
      "}\nplacement: {workers: 2}\ntraining: {batch_size: ", o.batch, ", steps: ", o.steps,
      ", loss: mse, scale_grads: true, optimizer: {kind: sgd, lr: ", o.lr,
      "}}\ndata: {kind: tensors, path: ", work, "/data.pt}\n");
  const std::string id =
      sc::bench::RunJob(c, spec, absl::Minutes(10), "Stagecoach " + schedule).id();
  Run run;
  for (const json& event : sc::bench::StepEvents(c, id)) {
    if (static_cast<int>(run.losses.size()) >= o.warmup)
      run.times.push_back(event["step_time_seconds"].get<double>());
    run.losses.push_back(event["loss"].is_null() ? NAN : event["loss"].get<double>());
  }
  if (static_cast<int>(run.losses.size()) != o.steps) {
    sc::bench::Fail("watch " + id, absl::InternalError(absl::StrCat(run.losses.size(), " steps")));
  }
  return run;
}

// The LibTorch and OpenBLAS packages of the machine, or of the chroot `root`.
std::string StackVersions(const std::string& root) {
  std::vector<std::string> argv;
  if (!root.empty()) argv = InChroot(root);
  argv.insert(argv.end(), {"/usr/bin/dpkg-query", "-W", "-f", "${Package} ${Version}, ",
                           "libtorch-dev", "libopenblas0-openmp"});
  sc::testing::CommandResult r = sc::testing::RunCommand(argv, absl::Seconds(30));
  absl::string_view out = absl::StripTrailingAsciiWhitespace(r.out);
  absl::ConsumeSuffix(&out, ",");
  return r.exit_code == 0 ? std::string(out) : "(dpkg-query failed: " + r.err + ")";
}

std::string Prepare(const Options& o, const std::string& work, const TorchSide& torch) {
  std::filesystem::create_directories(work);
  std::filesystem::copy_file(STAGECOACH_SOURCE_DIR "/bench/peer/torch_pipelining.py",
                             work + "/torch_pipelining.py",
                             std::filesystem::copy_options::overwrite_existing);
  std::string model = o.model;
  if (model == "big" || model == "tiny") {
    sc::testing::CommandResult made = sc::testing::RunCommand(
        {"/usr/bin/python3", STAGECOACH_SOURCE_DIR "/tests/models/make_models.py", work + "/models",
         "--bench"},
        absl::Minutes(5));
    if (made.exit_code != 0) sc::bench::Fail("make_models.py", absl::InternalError(made.err));
    model = work + (o.model == "big" ? "/models/bench_mlp.pt" : "/models/bench_tiny_mlp.pt");
  }
  std::filesystem::copy_file(model, work + "/model.pt",
                             std::filesystem::copy_options::overwrite_existing);
  torch.Call({"data", "--model", torch.Inside(work + "/model.pt"), "--rows",
              absl::StrCat(o.batch * o.steps), "--out", torch.Inside(work + "/data.pt")},
             300);
  return model;
}

// The Stagecoach builds --stacks names, each with its cluster of daemons.
std::vector<Stack> StartStacks(const Options& o, const TorchSide& torch, const std::string& work) {
  std::vector<Stack> stacks;
  for (absl::string_view name : absl::StrSplit(o.stacks, ',', absl::SkipEmpty())) {
    sc::testing::ClusterOptions options;
    options.check_lock_order = false;
    options.workers = 2;
    options.worker_args = {"--threads", absl::StrCat(o.threads)};
    options.log_level = o.log_level;
    Stack stack;
    stack.name = std::string(name);
    stack.work = work;
    if (name == "root") {
      if (o.torch_root.empty()) {
        sc::bench::Fail("--stacks root", absl::InvalidArgumentError("needs a --torch-root"));
      }
      options.daemon_binary_dir = o.root_build;
      options.launcher = InChroot(o.torch_root);
      stack.work = torch.Inside(work);
    } else if (name != "host") {
      sc::bench::Fail("--stacks", absl::InvalidArgumentError(absl::StrCat(
                                      "'", name, "': expected host or root, comma-separated")));
    }
    stack.cluster =
        sc::bench::Value("cluster (" + stack.name + ")", sc::testing::LocalCluster::Start(options));
    stacks.push_back(std::move(stack));
  }
  if (stacks.empty()) sc::bench::Fail("--stacks", absl::InvalidArgumentError("none given"));
  return stacks;
}

// Every schedule, --rounds times, every stack and PyTorch in turn; then PyTorch as shipped.
std::vector<Row> RunRounds(const Options& o, const TorchSide& torch,
                           const std::vector<Stack>& stacks) {
  std::vector<Row> rows;
  for (absl::string_view s : absl::StrSplit(o.schedules, ',', absl::SkipEmpty())) {
    rows.emplace_back();
    rows.back().schedule = std::string(s);
    rows.back().ours.resize(stacks.size());
    rows.back().ours_round_spreads.resize(stacks.size());
    rows.back().max_loss_diff.assign(stacks.size(), 0.0);
  }
  const int sides = static_cast<int>(stacks.size()) + 1;  // the stacks, then PyTorch
  for (int round = 0; round < o.rounds; ++round) {
    for (Row& row : rows) {
      // Rotate which side goes first so that drift over time falls on every side.
      std::vector<Run> ours(stacks.size());
      Run theirs;
      for (int k = 0; k < sides; ++k) {
        const int side = (k + round) % sides;
        if (side < static_cast<int>(stacks.size())) {
          ours[side] = MeasureOurs(*stacks[side].cluster, o, stacks[side].work, row.schedule);
        } else {
          theirs = torch.Measure(row.schedule, &row.torch_info);
        }
      }
      row.theirs.insert(row.theirs.end(), theirs.times.begin(), theirs.times.end());
      row.theirs_round_spreads.push_back(Spread(theirs.times));
      for (size_t i = 0; i < stacks.size(); ++i) {
        row.ours[i].insert(row.ours[i].end(), ours[i].times.begin(), ours[i].times.end());
        row.ours_round_spreads[i].push_back(Spread(ours[i].times));
        for (size_t k = 0; k < ours[i].losses.size() && k < theirs.losses.size(); ++k) {
          const double diff = std::abs(ours[i].losses[k] - theirs.losses[k]);
          row.max_loss_diff[i] = std::isnan(diff) ? NAN : std::max(row.max_loss_diff[i], diff);
        }
        std::fprintf(stderr,
                     "round %d %-22s ours (%s) %.1f ms, PyTorch %.1f ms; last loss %.9g, "
                     "%.9g\n",
                     round, row.schedule.c_str(), stacks[i].name.c_str(),
                     1e3 * sc::bench::Median(ours[i].times), 1e3 * sc::bench::Median(theirs.times),
                     ours[i].losses.back(), theirs.losses.back());
      }
    }
  }
  if (o.shipped_steps > 0) {
    for (Row& row : rows) row.shipped = torch.Shipped(row.schedule);
  }
  return rows;
}

// The header (model, both sides, their stacks and PyTorch's workarounds) and a row per schedule
// and stack.
void PrintTable(const Options& o, const std::string& model, const std::vector<Stack>& stacks,
                const std::vector<Row>& rows) {
  const json& info = rows.empty() ? json() : rows[0].torch_info;
  std::printf(
      "Model %s; batch %d in %d microbatches, mse, SGD lr %g; 2 ranks; %d rounds x %d measured "
      "steps (after %d) per side and schedule; %ld CPUs here.\n",
      model.c_str(), o.batch, o.microbatches, o.lr, o.rounds, o.steps - o.warmup, o.warmup,
      sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "Stagecoach: coordinator and 2 workers (--threads %d), gradients averaged over "
      "microbatches (training.scale_grads: true).\n",
      o.threads);
  for (const Stack& stack : stacks) {
    std::printf("  stack %s: %s\n", stack.name.c_str(),
                StackVersions(stack.name == "root" ? o.torch_root : "").c_str());
  }
  std::printf("PyTorch %s: 2 processes over gloo, threads per rank %s, gradients %s;\n",
              info.value("torch", "?").c_str(), info.value("threads", json()).dump().c_str(),
              info.value("grad_scaling", "?").c_str());
  std::printf("  stack: %s\n", StackVersions(o.torch_root).c_str());
  std::printf("  workarounds: %s\n\n", info.value("workarounds", json()).dump().c_str());
  std::printf("%-22s %-5s %9s %7s %7s %9s %7s %7s %7s %10s  %s\n", "schedule", "stack", "ours_ms",
              "p90/50", "in_run", "torch_ms", "p90/50", "in_run", "ratio", "loss_diff",
              "PyTorch as shipped");
  for (const Row& row : rows) {
    const double theirs = sc::bench::Median(row.theirs);
    for (size_t i = 0; i < stacks.size(); ++i) {
      const double ours = sc::bench::Median(row.ours[i]);
      std::printf("%-22s %-5s %9.2f %7.3f %7.3f %9.2f %7.3f %7.3f %7.3f %10.1e  %s\n",
                  row.schedule.c_str(), stacks[i].name.c_str(), 1e3 * ours, Spread(row.ours[i]),
                  sc::bench::Median(row.ours_round_spreads[i]), 1e3 * theirs, Spread(row.theirs),
                  sc::bench::Median(row.theirs_round_spreads), theirs / ours, row.max_loss_diff[i],
                  row.shipped.c_str());
    }
  }
  std::printf(
      "\nratio: PyTorch's median step / Stagecoach's (above 1: Stagecoach is faster)\n"
      "p90/50: over the steps of every round (with the machine's drift between rounds); in_run: "
      "the median over rounds of each round's own p90/50\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Stagecoach against torch.distributed.pipelining on one job"};
  Options o;
  app.add_option("--torch-root", o.torch_root,
                 "chroot with PyTorch >= 2.4 (scripts/trixie_chroot.sh); '' runs --python here");
  app.add_option("--python", o.python,
                 "a Python with PyTorch >= 2.4, its full path (with --torch-root '')");
  app.add_option("--model", o.model, "big, tiny or a TorchScript Sequential of Linear and ReLU");
  app.add_option("--schedules", o.schedules, "schedules, comma-separated");
  app.add_option("--rounds", o.rounds, "times each side runs each schedule (alternating)");
  app.add_option("--steps", o.steps, "steps of each run");
  app.add_option("--warmup", o.warmup, "steps of each run left out of the figures");
  app.add_option("--batch", o.batch, "rows per step");
  app.add_option("--microbatches", o.microbatches, "microbatches per step");
  app.add_option("--threads", o.threads, "compute threads of each rank on both sides");
  app.add_option("--lr", o.lr, "SGD learning rate");
  app.add_option("--log-level", o.log_level, "the daemons' --log-level");
  app.add_option("--shipped-steps", o.shipped_steps,
                 "steps of the run of PyTorch as shipped (0: do not run it)");
  app.add_option("--shipped-timeout", o.shipped_timeout, "seconds before calling it hung");
  app.add_option("--stacks", o.stacks,
                 "Stagecoach builds to run: host (this one), root (--root-build in --torch-root, "
                 "on PyTorch's LibTorch and BLAS), or host,root");
  app.add_option("--root-build", o.root_build,
                 "the build tree inside --torch-root (scripts/test_trixie.sh makes /build-trixie)");
  CLI11_PARSE(app, argc, argv);
  if (o.warmup >= o.steps) sc::bench::Fail("--warmup", absl::InvalidArgumentError(">= --steps"));

  const std::string work =
      absl::StrCat(o.torch_root, "/tmp/stagecoach-peer-bench-", static_cast<int>(getpid()));
  TorchSide torch(o, work);
  const std::string model = Prepare(o, work, torch);

  std::vector<Stack> stacks = StartStacks(o, torch, work);
  std::vector<Row> rows = RunRounds(o, torch, stacks);
  PrintTable(o, model, stacks, rows);
  std::filesystem::remove_all(work);
  return 0;
}
