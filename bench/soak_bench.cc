// Soak: one long job through real daemons (a coordinator and two workers on loopback) with
// pause/resume cycles and checkpoints, sampling the resident memory of every daemon as the job
// runs, and printing each one's growth per step (least-squares slope over the second half of the
// run, after warm-up, and over all of it) and the size of what status and list return.
//
//   soak_bench [--steps 100000] [--pause-every 200] [--checkpoint-every 500] [--samples 40]
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "common/rpc/channel.h"
#include "tests/support/local_cluster.h"

namespace sc = stagecoach;

namespace {

// VmRSS of `pid` in bytes; 0 when it cannot be read.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kb = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb * 1024;
  }
  return 0;
}

struct Sample {
  int64_t step = 0;
  std::vector<int64_t> rss;  // coordinator, then workers
};

// Least-squares slope of rss[d] against step over samples [from, end).
double Slope(const std::vector<Sample>& s, size_t from, size_t d) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = from; i < s.size(); ++i) {
    const double x = static_cast<double>(s[i].step), y = static_cast<double>(s[i].rss[d]);
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double den = n * sxx - sx * sx;
  return den > 0 ? (n * sxy - sx * sy) / den : 0.0;
}

class Soak {
 public:
  explicit Soak(sc::testing::LocalCluster& cluster) : c_(cluster) {
    stub_ = sc::v1::CoordinatorService::NewStub(sc::rpc::MakeChannel(c_.coordinator_address()));
  }

  sc::v1::Job Get(bool all, size_t* bytes) {
    sc::v1::GetJobRequest req;
    req.set_job_id(id_);
    req.set_history_all(all);
    const auto resp = Call(&Stub::GetJob, req, sc::v1::GetJobResponse(), "GetJob");
    if (bytes != nullptr) *bytes = resp.ByteSizeLong();
    return resp.job();
  }
  size_t ListBytes() {
    return Call(&Stub::ListJobs, sc::v1::ListJobsRequest(), sc::v1::ListJobsResponse(),
                "ListJobs")
        .ByteSizeLong();
  }
  void Pause() {
    sc::v1::PauseJobRequest req;
    req.set_job_id(id_);
    Call(&Stub::PauseJob, req, sc::v1::PauseJobResponse(), "PauseJob");
  }
  void Resume() {
    sc::v1::ResumeJobRequest req;
    req.set_job_id(id_);
    Call(&Stub::ResumeJob, req, sc::v1::ResumeJobResponse(), "ResumeJob");
  }
  std::string id_;

 private:
  using Stub = sc::v1::CoordinatorService::Stub;

  // One call with a 60 s deadline; stops the benchmark on an error.
  template <typename Req, typename Resp>
  Resp Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*), const Req& req,
            Resp resp, const char* what) {
    grpc::ClientContext ctx;
    sc::rpc::SetDeadline(&ctx, absl::Seconds(60));
    grpc::Status s = (stub_.get()->*method)(&ctx, req, &resp);
    if (!s.ok()) sc::bench::Fail(what, absl::InternalError(s.error_message()));
    return resp;
  }

  sc::testing::LocalCluster& c_;
  std::unique_ptr<sc::v1::CoordinatorService::Stub> stub_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Soak: RSS of every daemon over a long job with pause/resume and checkpoints"};
  int64_t steps = 100000, pause_every = 200, checkpoint_every = 500;
  int samples = 40;
  app.add_option("--steps", steps, "steps of the job");
  app.add_option("--pause-every", pause_every, "pause and resume after every this many steps");
  app.add_option("--checkpoint-every", checkpoint_every, "checkpoint every this many steps");
  app.add_option("--samples", samples, "RSS samples over the run");
  CLI11_PARSE(app, argc, argv);

  sc::testing::ClusterOptions options;
  options.check_lock_order = false;
  options.workers = 2;
  // With a job table on disk, as a production coordinator runs.
  const std::string data_dir = absl::StrCat("/tmp/soak-bench-", getpid());
  options.coordinator_args = {"--data-dir", data_dir};
  auto cluster = sc::bench::Value("cluster", sc::testing::LocalCluster::Start(options));
  sc::testing::LocalCluster& c = *cluster;
  Soak soak(c);
  const std::string spec =
      absl::StrCat("name: soak\nmodel: {builtin: {family: mlp, sizes: [8, 16, 16, 4]}}\n",
                   "split: {stages: 2}\nschedule: {kind: 1F1B, microbatches: 2}\n",
                   "training: {batch_size: 4, steps: ", steps, ", checkpoint: {dir: ", c.dir(),
                   "/ckpt, every_steps: ", checkpoint_every, "}}\n");
  soak.id_ = sc::bench::Value("submit", c.Submit(spec));
  std::vector<pid_t> pids = {c.coordinator().pid()};
  for (int i = 0; i < c.num_workers(); ++i) pids.push_back(c.worker(i).pid());

  std::vector<Sample> taken;
  const int64_t sample_every = std::max<int64_t>(1, steps / samples);
  int64_t next_sample = 0, next_pause = pause_every;
  int pauses = 0;
  const absl::Time start = absl::Now();
  std::printf("%10s %10s %14s %14s %14s\n", "step", "seconds", "coordinator", "worker 0",
              "worker 1");
  while (true) {
    const sc::v1::Job job = soak.Get(false, nullptr);
    const int64_t done = job.steps_done();
    if (done >= next_sample || done >= steps) {
      Sample s{done, {}};
      for (pid_t pid : pids) s.rss.push_back(ResidentBytes(pid));
      taken.push_back(s);
      std::printf("%10lld %10.1f %11.1f MB %11.1f MB %11.1f MB\n", static_cast<long long>(done),
                  absl::ToDoubleSeconds(absl::Now() - start), s.rss[0] / 1e6, s.rss[1] / 1e6,
                  s.rss[2] / 1e6);
      std::fflush(stdout);
      next_sample = done + sample_every;
    }
    if (job.state() == sc::v1::JOB_STATE_SUCCEEDED) break;
    if (job.state() == sc::v1::JOB_STATE_FAILED || job.state() == sc::v1::JOB_STATE_CANCELLED) {
      sc::bench::Fail("job", absl::InternalError(job.reason()));
    }
    if (pause_every > 0 && done >= next_pause && done + 2 < steps &&
        job.state() == sc::v1::JOB_STATE_RUNNING) {
      soak.Pause();
      while (soak.Get(false, nullptr).state() != sc::v1::JOB_STATE_PAUSED) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      soak.Resume();
      ++pauses;
      next_pause = done + pause_every;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  size_t summary_bytes = 0, whole_bytes = 0;
  const sc::v1::Job whole = soak.Get(true, &whole_bytes);
  soak.Get(false, &summary_bytes);
  std::printf("\n%lld steps in %.0f s (%.2f ms/step), %d pause/resume cycles, %d checkpoints\n",
              static_cast<long long>(steps), seconds, 1e3 * seconds / steps, pauses,
              whole.checkpoints_size());
  const char* names[] = {"coordinator", "worker 0", "worker 1"};
  // Slopes over the samples taken while the job ran; those at its last step (as it ends: the
  // final checkpoint and record) only show in "RSS at end".
  std::vector<Sample> running;
  for (const Sample& s : taken) {
    if (s.step < steps) running.push_back(s);
  }
  std::printf("%-12s %14s %14s %16s %16s\n", "daemon", "RSS first", "RSS at end",
              "B/step (all)", "B/step (2nd half)");
  for (size_t d = 0; d < pids.size(); ++d) {
    std::printf("%-12s %11.1f MB %11.1f MB %16.3f %16.3f\n", names[d], taken.front().rss[d] / 1e6,
                taken.back().rss[d] / 1e6, Slope(running, 0, d),
                Slope(running, running.size() / 2, d));
  }
  std::printf(
      "status (default summary): %zu bytes; status --history: %zu bytes; list: %zu "
      "bytes\n",
      summary_bytes, whole_bytes, soak.ListBytes());
  cluster.reset();
  std::filesystem::remove_all(data_dir);
  return 0;
}
