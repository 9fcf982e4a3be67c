// Asynchronous against synchronous checkpoints (issue 39), in one process on CPU: an MLP of
// --layers Linear(--width, --width) layers (6 x 4096 x 4096: 100.7M parameters) trained with
// AdamW on --rows rows, one stage holding it all. Each round runs, alternately so that the
// machine's other load hits both alike:
//   - sync:  a step, then the stage's checkpoint written on the step loop (what every checkpoint
//            step did before: SnapshotState + WriteSnapshot, both files, SHA-256, fsync);
//   - async: a step, then SnapshotState (the copy to host memory) and BackgroundWriter::Start,
//            and --after more steps while the writer pickles, hashes and syncs; then Drain.
// Prints medians over --rounds rounds after one untimed warm-up: a plain step, the checkpointing
// step (the step plus what the step loop waits for: the whole write, or the copy), the steps
// that run beside the background write (slower: they share the cores and memory bandwidth), the
// background write itself, and the bytes written (MB is 10^6 bytes).
//
//   build/bench/checkpoint_bench [--width 4096] [--layers 6] [--rows 8] [--rounds 3]
//                                [--after 4] [--dir DIR]
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_support.h"
#include "worker/runtime/checkpoint/background_writer.h"
#include "worker/runtime/checkpoint/checkpoint.h"

namespace rt = stagecoach::runtime;
namespace bench = stagecoach::bench;

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Model {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  int64_t width = 0;
  int64_t rows = 0;

  double Step() {
    const Clock::time_point start = Clock::now();
    optimizer->zero_grad();
    torch::Tensor h = torch::randn({rows, width});
    for (size_t i = 0; i < params.size(); i += 2) {
      h = torch::tanh(torch::addmm(params[i + 1].second, h, params[i].second.t()));
    }
    h.pow(2).mean().backward();
    optimizer->step();
    return Since(start);
  }
};

Model MakeModel(int64_t width, int layers, int64_t rows) {
  Model m;
  m.width = width;
  m.rows = rows;
  std::vector<torch::Tensor> all;
  for (int l = 0; l < layers; ++l) {
    m.params.emplace_back(std::to_string(l) + ".weight",
                          (torch::randn({width, width}) / std::sqrt(width)).requires_grad_());
    m.params.emplace_back(std::to_string(l) + ".bias", torch::zeros({width}).requires_grad_());
  }
  for (const auto& [name, p] : m.params) all.push_back(p);
  m.optimizer = std::make_unique<torch::optim::AdamW>(all, torch::optim::AdamWOptions(1e-4));
  return m;
}

int64_t Bytes(const std::vector<stagecoach::v1::StageCheckpointFile>& files) {
  int64_t n = 0;
  for (const auto& f : files) n += f.size_bytes();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"asynchronous against synchronous checkpoints"};
  int64_t width = 4096, rows = 8;
  int layers = 6, rounds = 3, after = 4;
  std::string dir = "/tmp/stagecoach-checkpoint-bench";
  app.add_option("--width", width);
  app.add_option("--layers", layers);
  app.add_option("--rows", rows);
  app.add_option("--rounds", rounds);
  app.add_option("--after", after, "steps run beside each background write");
  app.add_option("--dir", dir);
  CLI11_PARSE(app, argc, argv);

  Model m = MakeModel(width, layers, rows);
  int64_t numel = 0;
  for (const auto& [name, p] : m.params) numel += p.numel();
  std::printf("model: %d x Linear(%ld, %ld), %.1fM parameters, AdamW, %ld rows, %d threads\n",
              layers, static_cast<long>(width), static_cast<long>(width), numel / 1e6,
              static_cast<long>(rows), torch::get_num_threads());
  std::vector<double> plain, sync_step, async_step, beside, written;
  int64_t bytes = 0;
  int64_t global_step = 0;
  auto checkpoint_dir = [&](const char* kind) { return dir + "/" + kind; };
  // A step, then the copy of the model's state for its checkpoint.
  auto CheckpointingStep = [&]() {
    m.Step();
    ++global_step;
    return bench::Value("snapshot", rt::SnapshotState(0, global_step, "stage-0.pt", true, m.params,
                                                      {}, *m.optimizer, global_step));
  };
  for (int round = 0; round <= rounds; ++round) {
    const bool timed = round > 0;
    std::filesystem::remove_all(dir);
    // Plain steps.
    for (int i = 0; i < 3; ++i) {
      const double t = m.Step();
      if (timed) plain.push_back(t);
    }
    // Synchronous: the step waits for the whole write.
    {
      const Clock::time_point start = Clock::now();
      rt::StateSnapshot snapshot = CheckpointingStep();
      auto files = bench::Value("write", rt::WriteSnapshot(checkpoint_dir("sync"), snapshot));
      if (timed) sync_step.push_back(Since(start));
      bytes = Bytes(files);
    }
    // Asynchronous: the step waits for the copy; the write runs beside the next steps.
    {
      rt::BackgroundWriter writer("bench", absl::Minutes(10));
      const Clock::time_point start = Clock::now();
      rt::StateSnapshot snapshot = CheckpointingStep();
      Clock::time_point write_start;
      double write_seconds = 0;
      bench::Check("start", writer.Start([&, snapshot = std::move(snapshot)]() -> absl::Status {
        write_start = Clock::now();
        auto files = rt::WriteSnapshot(checkpoint_dir("async"), snapshot);
        write_seconds = Since(write_start);
        return files.status();
      }));
      if (timed) async_step.push_back(Since(start));
      for (int i = 0; i < after; ++i) {
        const double t = m.Step();
        if (timed) beside.push_back(t);
      }
      bench::Check("drain", writer.Drain());
      if (timed) written.push_back(write_seconds);
    }
  }
  std::filesystem::remove_all(dir);
  const double p = bench::Median(plain);
  std::printf("checkpoint files: %.0f MB per checkpoint (state with AdamW, and export)\n",
              bytes / 1e6);
  std::printf("plain step:                        %8.3f s\n", p);
  std::printf("checkpointing step, synchronous:   %8.3f s  (%.2fx a plain step)\n",
              bench::Median(sync_step), bench::Median(sync_step) / p);
  std::printf("checkpointing step, asynchronous:  %8.3f s  (%.2fx a plain step)\n",
              bench::Median(async_step), bench::Median(async_step) / p);
  std::printf("steps beside the background write: %8.3f s  (%.2fx a plain step, %d per round)\n",
              bench::Median(beside), bench::Median(beside) / p, after);
  std::printf("background write:                  %8.3f s  (%.0f MB/s)\n", bench::Median(written),
              bytes / 1e6 / bench::Median(written));
  return 0;
}
