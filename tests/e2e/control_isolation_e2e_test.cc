// Step control is serialised per job, end to end: job A's client step waits on a worker that is
// SIGSTOPped, and meanwhile `stagectl pause B` and `stagectl status B` answer at once (within a
// generous bound, and while A's step is provably still stuck); once the worker goes on, A's
// step finishes too. The deterministic proof is tests/unit/control_isolation_test.cc.
#include <signal.h>
#include <torch/torch.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/npy_files.h"
#include "tests/support/reference_mlp.h"

namespace stagecoach::testing::control_isolation_e2e_test {
namespace {

using ::testing::HasSubstr;

ReferenceConfig Config(int64_t steps) { return SmallSgdMlp(steps, 3, 4); }

// What pause and status of another job may take while A is stuck, generously: with control
// serialised globally they would wait for A's call to the frozen worker (--worker-rpc-timeout,
// 120 s here).
constexpr absl::Duration kPromptly = absl::Seconds(30);

TEST(ControlIsolationE2E, AnotherJobsPauseAndStatusAnswerWhileAJobsStepWaitsOnAFrozenWorker) {
  ClusterOptions options;
  options.workers = 4;
  // A stopped worker must not be declared lost while the test holds it, and its ControlTask
  // call must outlast the test's bound by far.
  options.lease = "300s";
  options.heartbeat_interval = "1s";
  options.coordinator_args = {"--worker-rpc-timeout", "120s"};
  auto started = LocalCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& c = **started;
  const std::string dir = c.dir();

  const std::string spec_a =
      c.WriteFile("a.yaml", MlpSpecYaml(Config(20), {"a", "1F1B", 2, 2, 4}, dir + "/ckpt-a"));
  const std::string spec_b =
      c.WriteFile("b.yaml", MlpSpecYaml(Config(100000), {"b", "1F1B", 2, 2, 4}, dir + "/ckpt-b"));
  CommandResult submit_a = c.Stagectl({"submit", spec_a, "--paused"});
  ASSERT_EQ(submit_a.exit_code, 0) << submit_a.err;
  const std::string a = LastLine(submit_a.out);
  auto paused = c.WaitForJob(
      a, [](const v1::Job& j) { return IsFinal(j) || j.state() == v1::JOB_STATE_PAUSED; },
      absl::Seconds(60));
  ASSERT_TRUE(paused.ok()) << paused.status();
  ASSERT_EQ(paused->state(), v1::JOB_STATE_PAUSED) << History(*paused) << c.Logs();
  CommandResult submit_b = c.Stagectl({"submit", spec_b});
  ASSERT_EQ(submit_b.exit_code, 0) << submit_b.err;
  const std::string b = LastLine(submit_b.out);
  auto running = c.WaitForJob(
      b, [](const v1::Job& j) { return IsFinal(j) || j.steps_done() >= 2; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << History(*running) << c.Logs();

  // Freeze A's rank 1 and start a client step on A: it waits in the call to that worker.
  const int frozen = c.WorkerIndex(paused->ranks(1).worker_id());
  ASSERT_GE(frozen, 0);
  torch::manual_seed(1);
  const std::string inputs = dir + "/x.npy", targets = dir + "/y.npy";
  WriteNpy(inputs, torch::randn({16, 8}));
  WriteNpy(targets, torch::randn({16, 4}));
  c.worker(frozen).Signal(SIGSTOP);
  std::atomic<bool> step_returned{false};
  CommandResult step;
  std::thread client([&] {
    step = c.Stagectl({"step", a, "--inputs", inputs, "--targets", targets, "--timeout", "5m"},
                      absl::Seconds(300));
    step_returned = true;
  });
  absl::SleepFor(absl::Seconds(2));  // the step's ControlTask reaches the frozen worker

  const absl::Time t0 = absl::Now();
  CommandResult pause_b = c.Stagectl({"pause", b}, absl::Seconds(100));
  CommandResult status_b = c.Stagectl({"-o", "json", "status", b}, absl::Seconds(100));
  const absl::Duration took = absl::Now() - t0;
  const bool a_still_stuck = !step_returned.load();
  c.worker(frozen).Signal(SIGCONT);
  client.join();

  EXPECT_EQ(pause_b.exit_code, 0) << pause_b.err;
  EXPECT_EQ(status_b.exit_code, 0) << status_b.err;
  EXPECT_THAT(status_b.out, HasSubstr(absl::StrCat("\"id\": \"", b, "\"")));
  EXPECT_LT(took, kPromptly) << "pause and status of " << b << " waited for " << a;
  EXPECT_TRUE(a_still_stuck) << "A's step returned before B was steered: nothing was proved";
  EXPECT_EQ(step.exit_code, 0) << step.out << step.err << c.Logs();
  EXPECT_THAT(step.out, HasSubstr("loss"));
  for (const std::string& id : {a, b}) c.Stagectl({"cancel", id});
}

}  // namespace
}  // namespace stagecoach::testing::control_isolation_e2e_test
