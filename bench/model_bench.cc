// Measures a user's TorchScript model on CPU, in one process:
//
//   1. Graph-split overhead. The whole module (torch::jit::load) runs forward and backward
//      (loss = output.pow(2).mean()) against the same model cut by TorchScriptModel::Split into
//      --stages stages at equal layer counts and run as a pipeline runs them: every stage's
//      ForwardValues on detached copies of its inputs (those from other stages require grad when
//      floating point; the batch does not, as in the worker), wired by the returned
//      PipelineWiring, then backward stage by stage from the last (the loss) to the first with
//      torch::autograd::backward(outputs, grads), each input's .grad() handed to its producer
//      (summed per output over its consumers). Both run with the graph executor's optimisation
//      off (GraphOptimizerEnabledGuard(false)), as the worker runs stages. Prints ms per
//      iteration, the ratio split/whole, and the bytes that cross stage boundaries per
//      microbatch. The split's parameter gradients must equal the whole module's (allclose,
//      1e-5) or the bench exits with status 1, so the figure is that of a correct split.
//   2. Checkpoint write and restore. The whole model as one stage (Split({0}), Stage(0)) with an
//      AdamW optimizer after one step: WriteStageCheckpoint (both files, SHA-256, fsync) into a
//      fresh directory per iteration, and RestoreStageCheckpoint (SHA-256 and layout checks,
//      parameters and optimizer state), with MB and MB/s (MB is 10^6 bytes).
//
// Every figure is the median of --iterations runs after --warmup untimed ones; section 1
// alternates the whole and the split run so that the machine's other load hits both alike.
// Each iteration starts with the parameters' gradients unset (outside the timing).
//
// Models: tests/models/make_models.py writes two benchmark models (input width 1024, about 8.4M
// parameters each) when asked with --bench:
//   /usr/bin/python3 tests/models/make_models.py build/bench-models --bench
// bench_mlp.pt (nn.Sequential, 16 layers) and bench_skip.pt (skip connections across two stage
// boundaries at 4 stages).
//
//   build/bench/model_bench --model FILE --width W [--rows N] [--stages N] [--iterations N]
//                           [--warmup N] [--threads N] [--dir DIR]
#include <stdlib.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/bench_support.h"
#include "worker/model/stage_model.h"
#include "worker/model/torchscript_model.h"
#include "worker/runtime/checkpoint/checkpoint.h"

namespace md = stagecoach::model;
namespace rt = stagecoach::runtime;

namespace {

using stagecoach::bench::Check;
using stagecoach::bench::Fail;
using stagecoach::bench::Median;
using stagecoach::bench::Value;

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;
  int width = 0;
  int rows = 64;
  int stages = 4;
  int iterations = 20;
  int warmup = 3;
  int threads = 1;
  std::string dir;
};

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

torch::Tensor Loss(const torch::Tensor& output) { return output.pow(2).mean(); }

void UnsetGrads(const std::vector<torch::Tensor>& params) {
  for (torch::Tensor p : params) p.mutable_grad().reset();
}

// ---------------------------------------------------------------------------------------------
// Section 1: the whole module against its stages.

// The whole module's forward and backward on `x`.
void RunWhole(torch::jit::Module& whole, const torch::Tensor& x) {
  torch::jit::GraphOptimizerEnabledGuard plain(false);
  torch::Tensor out = whole.forward({x}).toTensor();
  Loss(out).backward();
}

struct SplitModel {
  md::PipelineWiring wiring;
  std::vector<std::unique_ptr<md::StageModel>> stages;
};

// Per-microbatch bytes crossing stage boundaries, forward (activations) and backward
// (gradients: floating-point values only).
struct Crossing {
  int64_t forward_bytes = 0;
  int64_t backward_bytes = 0;
  int values = 0;
};

// One forward and backward of the stages as a pipeline runs them; fills `crossing` when given.
void RunSplit(SplitModel& split, const torch::Tensor& x, Crossing* crossing) {
  torch::jit::GraphOptimizerEnabledGuard plain(false);
  const int n = static_cast<int>(split.stages.size());
  std::vector<std::vector<torch::Tensor>> inputs(n), outputs(n);
  for (int s = 0; s < n; ++s) {
    for (const md::ValueSource& source : split.wiring[s].inputs) {
      if (source.stage < 0) {
        inputs[s].push_back(x.detach());
        continue;
      }
      torch::Tensor in = outputs[source.stage].at(source.index).detach();
      if (in.is_floating_point()) in.requires_grad_(true);
      if (crossing != nullptr) {
        crossing->forward_bytes += in.nbytes();
        if (in.is_floating_point()) crossing->backward_bytes += in.nbytes();
        ++crossing->values;
      }
      inputs[s].push_back(in);
    }
    outputs[s] = split.stages[s]->ForwardValues(inputs[s]);
  }
  // Gradients of each stage's outputs, summed over their consumers.
  std::vector<std::vector<torch::Tensor>> grads(n);
  for (int s = 0; s < n; ++s) grads[s].resize(outputs[s].size());
  for (int s = n - 1; s >= 0; --s) {
    if (s == n - 1) {
      torch::autograd::backward({Loss(outputs[s].at(0))});
    } else {
      std::vector<torch::Tensor> outs, out_grads;
      for (size_t i = 0; i < outputs[s].size(); ++i) {
        if (!grads[s][i].defined() || !outputs[s][i].requires_grad()) continue;
        outs.push_back(outputs[s][i]);
        out_grads.push_back(grads[s][i]);
      }
      if (!outs.empty()) torch::autograd::backward(outs, out_grads);
    }
    for (size_t i = 0; i < inputs[s].size(); ++i) {
      const md::ValueSource& source = split.wiring[s].inputs[i];
      if (source.stage < 0 || !inputs[s][i].requires_grad()) continue;
      const torch::Tensor& g = inputs[s][i].grad();
      if (!g.defined()) continue;
      torch::Tensor& sum = grads[source.stage][source.index];
      sum = sum.defined() ? sum + g : g;
    }
  }
}

// Compares the split's parameter gradients with the whole module's, by name; false (with a
// message on stderr) when a parameter is missing or differs.
bool SameGradients(torch::jit::Module& whole, SplitModel& split) {
  std::map<std::string, torch::Tensor> split_params;
  for (auto& stage : split.stages) {
    for (auto& [name, p] : stage->NamedParameters()) split_params[name] = p;
  }
  size_t count = 0;
  for (const auto& p : whole.named_parameters(/*recurse=*/true)) {
    ++count;
    auto it = split_params.find(p.name);
    if (it == split_params.end()) {
      std::fprintf(stderr, "parameter %s: no stage holds it\n", p.name.c_str());
      return false;
    }
    const torch::Tensor a = p.value.grad(), b = it->second.grad();
    if (!a.defined() || !b.defined()) {
      std::fprintf(stderr, "parameter %s: gradient missing (whole %d, split %d)\n", p.name.c_str(),
                   a.defined(), b.defined());
      return false;
    }
    if (!torch::allclose(a, b, 1e-5, 1e-5)) {
      std::fprintf(stderr, "parameter %s: gradients differ (max |diff| %g)\n", p.name.c_str(),
                   (a - b).abs().max().item<double>());
      return false;
    }
  }
  if (count != split_params.size()) {
    std::fprintf(stderr, "the stages hold %zu parameters, the whole module %zu\n",
                 split_params.size(), count);
    return false;
  }
  return true;
}

// Returns the number of the model's parameter elements.
int64_t BenchSplit(const Options& o, md::TorchScriptModel& model) {
  torch::jit::Module whole = torch::jit::load(o.model);
  std::vector<torch::Tensor> whole_params;
  int64_t param_elements = 0;
  for (const auto& p : whole.named_parameters(/*recurse=*/true)) {
    whole_params.push_back(p.value);
    param_elements += p.value.numel();
  }

  const int layers = static_cast<int>(model.layers().size());
  if (o.stages > layers) {
    Fail("--stages",
         absl::InvalidArgumentError("the model has only " + std::to_string(layers) + " layers"));
  }
  std::vector<int> first_layers;
  for (int s = 0; s < o.stages; ++s) first_layers.push_back(s * layers / o.stages);
  SplitModel split;
  split.wiring = Value("Split", model.Split(first_layers));
  std::vector<torch::Tensor> split_params;
  for (int s = 0; s < o.stages; ++s) {
    split.stages.push_back(Value("Stage " + std::to_string(s), model.Stage(s)));
    for (torch::Tensor p : split.stages.back()->Parameters()) split_params.push_back(p);
  }

  std::printf("model %s: %d layers (%s), %.2fM parameters, input %d x %d float32, %d thread(s)\n",
              o.model.c_str(), layers, model.sequential() ? "sequential" : "graph split",
              param_elements / 1e6, o.rows, o.width, o.threads);
  std::printf("%d stages at equal layer counts:\n", o.stages);
  for (int s = 0; s < o.stages; ++s) {
    const int end = s + 1 < o.stages ? first_layers[s + 1] : layers;
    std::string sources;
    for (const md::ValueSource& source : split.wiring[s].inputs) {
      sources += (sources.empty() ? "" : ", ") + std::string("(") + std::to_string(source.stage) +
                 "," + std::to_string(source.index) + ")";
    }
    std::printf("  stage %d: layers %s..%s, %.2fM parameters, inputs from %s, %d output(s)\n", s,
                model.layers()[first_layers[s]].name.c_str(), model.layers()[end - 1].name.c_str(),
                split.stages[s]->ParameterCount() / 1e6, sources.c_str(),
                split.wiring[s].num_outputs);
  }

  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({o.rows, o.width});

  // Correctness first: one run of each from unset gradients.
  UnsetGrads(whole_params);
  UnsetGrads(split_params);
  RunWhole(whole, x);
  Crossing crossing;
  RunSplit(split, x, &crossing);
  if (!SameGradients(whole, split)) {
    std::fprintf(stderr, "the split's parameter gradients differ from the whole module's\n");
    std::exit(1);
  }

  std::vector<double> whole_ms, split_ms;
  for (int i = 0; i < o.warmup + o.iterations; ++i) {
    UnsetGrads(whole_params);
    Clock::time_point start = Clock::now();
    RunWhole(whole, x);
    const double w = MsSince(start);
    UnsetGrads(split_params);
    start = Clock::now();
    RunSplit(split, x, nullptr);
    const double s = MsSince(start);
    if (i >= o.warmup) {
      whole_ms.push_back(w);
      split_ms.push_back(s);
    }
  }
  const double whole_median = Median(whole_ms), split_median = Median(split_ms);
  // A Linear layer's forward and backward cost about 6 flops per weight per row (2 forward,
  // 2 for the input's gradient, 2 for the weight's).
  const double gflop = 6.0 * param_elements * o.rows / 1e9;

  std::printf(
      "\n1. Graph-split overhead, forward + backward of one %d-row microbatch "
      "(median of %d, %d warm-up)\n",
      o.rows, o.iterations, o.warmup);
  std::printf("%-28s  %10s  %10s\n", "", "ms/iter", "~GFLOP/s");
  std::printf("%-28s  %10.3f  %10.1f\n", "whole module", whole_median,
              gflop / (whole_median / 1e3));
  std::printf("%-28s  %10.3f  %10.1f\n", ("split, " + std::to_string(o.stages) + " stages").c_str(),
              split_median, gflop / (split_median / 1e3));
  std::printf("overhead ratio split/whole: %.3f (%+.1f%%)\n", split_median / whole_median,
              (split_median / whole_median - 1) * 100);
  std::printf(
      "crossing stage boundaries per microbatch: %d value(s), %.1f KiB forward "
      "(activations), %.1f KiB backward (gradients)\n",
      crossing.values, crossing.forward_bytes / 1024.0, crossing.backward_bytes / 1024.0);
  std::printf("parameter gradients: split == whole (allclose 1e-5), %zu tensors\n",
              whole_params.size());
  return param_elements;
}

// ---------------------------------------------------------------------------------------------
// Section 2: checkpoint write and restore of the whole model as one stage.

std::string MakeTempDir(const std::string& parent) {
  std::string pattern = (std::filesystem::path(parent) / "model_bench-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    Fail("--dir", absl::PermissionDeniedError("cannot create a directory in " + parent));
  }
  return pattern;
}

void BenchCheckpoint(const Options& o, md::TorchScriptModel& model) {
  Value("Split({0})", model.Split({0}));
  std::unique_ptr<md::StageModel> stage = Value("Stage(0)", model.Stage(0));
  const std::vector<std::pair<std::string, torch::Tensor>> params = stage->NamedParameters();
  torch::optim::AdamW optimizer(stage->Parameters(), torch::optim::AdamWOptions(1e-3));
  {
    torch::manual_seed(2);
    torch::jit::GraphOptimizerEnabledGuard plain(false);
    optimizer.zero_grad();
    Loss(stage->ForwardValues({torch::randn({o.rows, o.width})}).at(0)).backward();
    optimizer.step();
  }
  const std::string parent =
      o.dir.empty() ? std::filesystem::temp_directory_path().string() : o.dir;

  // Correctness first: a restore brings back perturbed parameters.
  {
    const std::string dir = MakeTempDir(parent);
    std::vector<stagecoach::v1::StageCheckpointFile> files =
        Value("WriteStageCheckpoint", rt::WriteStageCheckpoint(dir, 1, 0, params, {}, optimizer, 1));
    std::vector<torch::Tensor> saved;
    {
      torch::NoGradGuard no_grad;
      for (const auto& [name, p] : params) {
        saved.push_back(p.clone());
        p.add_(1.0);
      }
    }
    Check("RestoreStageCheckpoint", rt::RestoreStageCheckpoint(rt::CheckpointStepDir(dir, 1),
                                                               files.at(0), 0, params, optimizer));
    for (size_t i = 0; i < params.size(); ++i) {
      if (!torch::equal(saved[i], params[i].second)) {
        std::fprintf(stderr, "parameter %s: not restored\n", params[i].first.c_str());
        std::exit(1);
      }
    }
    std::filesystem::remove_all(dir);
  }

  std::vector<double> write_ms, restore_ms;
  int64_t written = 0, state_file = 0;
  for (int i = 0; i < o.warmup + o.iterations; ++i) {
    const std::string dir = MakeTempDir(parent);
    Clock::time_point start = Clock::now();
    std::vector<stagecoach::v1::StageCheckpointFile> files =
        Value("WriteStageCheckpoint", rt::WriteStageCheckpoint(dir, 1, 0, params, {}, optimizer, 1));
    const double w = MsSince(start);
    start = Clock::now();
    Check("RestoreStageCheckpoint", rt::RestoreStageCheckpoint(rt::CheckpointStepDir(dir, 1),
                                                               files.at(0), 0, params, optimizer));
    const double r = MsSince(start);
    written = 0;
    for (const auto& f : files) written += f.size_bytes();
    state_file = files.at(0).size_bytes();
    std::filesystem::remove_all(dir);
    if (i >= o.warmup) {
      write_ms.push_back(w);
      restore_ms.push_back(r);
    }
  }
  const double w = Median(write_ms), r = Median(restore_ms);
  std::printf(
      "\n2. Checkpoint of the whole model as one stage, AdamW state after one step, in %s "
      "(median of %d, %d warm-up)\n",
      parent.c_str(), o.iterations, o.warmup);
  std::printf("%-44s  %10s  %10s  %10s\n", "", "MB", "ms", "MB/s");
  std::printf("%-44s  %10.2f  %10.1f  %10.1f\n", "write (state + export files, SHA-256, fsync)",
              written / 1e6, w, written / 1e6 / (w / 1e3));
  std::printf("%-44s  %10.2f  %10.1f  %10.1f\n", "restore (state file, SHA-256, checks, copy)",
              state_file / 1e6, r, state_file / 1e6 / (r / 1e3));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"TorchScript model on CPU: graph-split overhead and checkpoint write/restore"};
  Options o;
  app.add_option("--model", o.model, "TorchScript file (torch.jit.save)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--width", o.width, "the model's input width (columns of the input)")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--rows", o.rows, "rows of the input (one microbatch)")
      ->check(CLI::PositiveNumber);
  app.add_option("--stages", o.stages, "stages to cut the model into")->check(CLI::PositiveNumber);
  app.add_option("--iterations", o.iterations, "timed runs")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed runs first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads, "LibTorch intra-op threads")->check(CLI::PositiveNumber);
  app.add_option("--dir", o.dir, "where checkpoint directories are made (default: the temp dir)")
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);

  torch::set_num_threads(o.threads);
  std::unique_ptr<md::TorchScriptModel> model =
      Value("loading --model", md::TorchScriptModel::Load(o.model, "--model"));
  BenchSplit(o, *model);
  BenchCheckpoint(o, *model);
  return 0;
}
