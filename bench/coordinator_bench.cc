// The coordinator's job manager over a long life: --jobs jobs (10,000 by default) are submitted
// and cancelled one after another against a JobManager in this process (the daemon's one malloc
// arena, no workers: each job is admitted, planned and queued, then cancelled), with retention at
// --retain-finished-jobs (the daemon's default, 1000) and, with --data-dir, the job table written
// to disk as the daemon writes it. Every --every jobs it prints the jobs held, the heap in use
// (glibc mallinfo2, the stagecoach_process_heap_in_use_bytes gauge) and resident memory, and the
// median time of a submit and of a cancel in that window; at the end, the heap's ratio between
// the last window and the first one after retention filled (1.00: flat).
//
//   build/bench/coordinator_bench [--jobs N] [--every N] [--retain-finished-jobs N]
//                                 [--data-dir DIR]
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_support.h"
#include "common/util/logging.h"
#include "common/process/malloc_tuning.h"
#include "common/util/work_queue.h"
#include "coordinator/job_manager.h"
#include "coordinator/jobs/job_store.h"
#include "coordinator/workers/kv_store.h"

namespace sc = stagecoach;
namespace coord = stagecoach::coordinator;

namespace {

constexpr char kSpec[] =
    "name: bench\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 2]}}\nsplit: {stages: 2}\n"
    "schedule: {kind: 1F1B, microbatches: 2}\ntraining: {batch_size: 4, steps: 5}\n";

// No worker ever registers, so none is ever called.
class NoWorkers : public coord::WorkerClient {
 public:
  absl::Status StartTask(const std::string&, const sc::v1::TaskAssignment&,
                         absl::Duration) override {
    return Unreachable();
  }
  absl::Status StopTask(const std::string&, const std::string&, const std::string&,
                        absl::Duration) override {
    return Unreachable();
  }
  absl::StatusOr<sc::v1::GetWorkerStatusResponse> GetStatus(const std::string&,
                                                            absl::Duration) override {
    return Unreachable();
  }
  absl::StatusOr<sc::v1::InspectModelResponse> InspectModel(const std::string&,
                                                            const sc::v1::InspectModelRequest&,
                                                            absl::Duration) override {
    return Unreachable();
  }
  absl::Status RequestCheckpoint(const std::string&, const std::string&, int64_t,
                                 absl::Duration) override {
    return Unreachable();
  }
  absl::StatusOr<sc::v1::ControlTaskResponse> ControlTask(const std::string&,
                                                          const sc::v1::ControlTaskRequest&,
                                                          absl::Duration) override {
    return Unreachable();
  }
  void SetSessionToken(const std::string&, const std::string&) override {}

 private:
  static absl::Status Unreachable() { return absl::UnavailableError("no workers in this bench"); }
};

double HeapKiB() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<double>(info.uordblks + info.hblkhd) / 1024;
}

double ResidentKiB() {
  std::ifstream statm("/proc/self/statm");
  long size = 0;
  long resident = 0;
  if (!(statm >> size >> resident)) return -1;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1024;
}

double MicrosecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  sc::LimitMallocArenas(1);  // as the coordinator daemon does, before any thread
  int jobs = 10000;
  int every = 1000;
  int retain = 1000;
  std::string data_dir;
  CLI::App app{"Coordinator job manager: memory and submit/cancel time over many jobs"};
  app.add_option("--jobs", jobs, "jobs submitted and cancelled")->check(CLI::PositiveNumber);
  app.add_option("--every", every, "jobs per printed window")->check(CLI::PositiveNumber);
  app.add_option("--retain-finished-jobs", retain, "finished jobs kept")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--data-dir", data_dir, "write the job table here (default: no table on disk)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);  // not a line per job dropped by retention

  sc::WorkQueue executor(2);
  NoWorkers workers;
  coord::KvStore kv;
  std::unique_ptr<coord::FileJobStore> store;
  if (!data_dir.empty()) {
    store = sc::bench::Value("--data-dir", coord::FileJobStore::Open(data_dir + "/jobs"));
  }
  coord::JobManagerOptions options;
  options.retain_finished_jobs = retain;
  coord::JobManagerDeps deps;
  deps.workers = &workers;
  deps.kv = &kv;
  deps.store = store.get();
  deps.executor = &executor;
  coord::JobManager manager(options, deps);

  std::printf("%8s %8s %12s %12s %12s %12s\n", "jobs", "held", "heap KiB", "resident KiB",
              "submit us", "cancel us");
  std::vector<double> submit_us;
  std::vector<double> cancel_us;
  double first_full_heap = -1;
  double last_heap = -1;
  for (int i = 1; i <= jobs; ++i) {
    auto start = std::chrono::steady_clock::now();
    const std::string id = sc::bench::Value("submit", manager.SubmitJob(kSpec, "bench.yaml"));
    submit_us.push_back(MicrosecondsSince(start));
    start = std::chrono::steady_clock::now();
    sc::bench::Value("cancel", manager.CancelJob(id, "bench"));
    cancel_us.push_back(MicrosecondsSince(start));
    if (i % every != 0 && i != jobs) continue;
    manager.Tick();  // retention runs on the manager's tick
    const size_t held = manager.ListJobs().size();
    const double heap = HeapKiB();
    if (first_full_heap < 0 && i > retain) first_full_heap = heap;
    last_heap = heap;
    std::printf("%8d %8zu %12.0f %12.0f %12.1f %12.1f\n", i, held, heap, ResidentKiB(),
                sc::bench::Median(submit_us), sc::bench::Median(cancel_us));
    submit_us.clear();
    cancel_us.clear();
  }
  if (first_full_heap > 0) {
    std::printf("heap at %d jobs / heap in the first window past %d retained: %.3f\n", jobs, retain,
                last_heap / first_full_heap);
  }
  return 0;
}
