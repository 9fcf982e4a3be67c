// The worker's task runner with ranks as threads: plans from the real planner, stages built
// from the spec, the real Gloo data plane bootstrapped through an in-memory store, and the
// pipeline executor — everything a worker process runs except gRPC. Results are held to the
// single-process reference; failures (a stop, a missing peer, a shape mismatch, a lost
// message) end every rank promptly with an error that names rank, action, peer, stage and
// microbatch.
#include "worker/runtime/task_runner.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/spec_parser.h"
#include "coordinator/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/stage_files.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace stagecoach::runtime {
namespace {

using ::testing::HasSubstr;

class RecordingReporter : public TaskReporter {
 public:
  absl::Status ReportStep(const v1::ReportStepRequest& report) override {
    absl::MutexLock lock(&mu_);
    steps_.push_back(report);
    return absl::OkStatus();
  }
  absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest& report) override {
    absl::MutexLock lock(&mu_);
    ends_.push_back(report);
    return absl::OkStatus();
  }
  std::vector<v1::ReportStepRequest> Steps(int rank) {
    absl::MutexLock lock(&mu_);
    std::vector<v1::ReportStepRequest> out;
    for (const auto& s : steps_) {
      if (s.rank() == rank) out.push_back(s);
    }
    return out;
  }
  std::vector<v1::ReportTaskEndRequest> Ends() {
    absl::MutexLock lock(&mu_);
    return ends_;
  }
  int StepsReported() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(steps_.size());
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::ReportStepRequest> steps_;
  std::vector<v1::ReportTaskEndRequest> ends_;
};

TransportFactory GlooFactory() {
  return [](const TransportRequest& request, transport::RendezvousStore* store) {
    transport::GlooOptions options;
    options.rank = request.rank;
    options.world_size = request.world_size;
    options.key_prefix = request.prefix;
    options.connect_timeout = request.timeout;
    return transport::CreateGlooTransport(options, store);
  };
}

// The tasks the coordinator would hand out for `spec_yaml`.
std::vector<v1::TaskAssignment> Assignments(const std::string& spec_yaml,
                                            absl::Duration comm_timeout) {
  auto spec = spec::ParseJobSpec(spec_yaml, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = coordinator::PlanJob(*spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<v1::TaskAssignment> tasks;
  for (int r = 0; r < plan->num_ranks; ++r) {
    v1::TaskAssignment t;
    t.set_job_id("job-test");
    t.set_attempt(1);
    t.set_rank(r);
    t.set_world_size(plan->num_ranks);
    t.set_num_stages(plan->num_stages);
    for (int owner : plan->stage_to_rank) t.add_stage_to_rank(owner);
    for (const auto& st : plan->stages) {
      if (plan->stage_to_rank[st.stage] != r) continue;
      auto* a = t.add_stages();
      a->set_stage(st.stage);
      a->set_first_layer(st.first_layer);
      a->set_end_layer(st.end_layer);
    }
    for (const auto& action : plan->lowered[r]) t.add_actions(action->ToString());
    t.set_spec_yaml(spec_yaml);
    t.set_rendezvous_prefix("jobs/job-test/attempt-1/");
    t.set_transport("gloo");
    *t.mutable_comm_timeout() = rpc::ToProtoDuration(comm_timeout);
    tasks.push_back(t);
  }
  return tasks;
}

// Runs every task on its own thread; `while_running` is called once all have started.
void RunAll(
    const std::vector<v1::TaskAssignment>& tasks, RecordingReporter* reporter,
    const std::function<void(std::vector<std::unique_ptr<TaskRunner>>&)>& while_running = nullptr) {
  transport::InMemoryStore store;
  std::vector<std::unique_ptr<TaskRunner>> runners;
  for (const auto& task : tasks) {
    runners.push_back(std::make_unique<TaskRunner>(
        task, TaskRunnerDeps{absl::StrCat("w-", task.rank()), reporter, &store, GlooFactory()}));
  }
  std::vector<std::thread> threads;
  for (auto& r : runners) {
    threads.emplace_back([&r, reporter] { (void)reporter->ReportTaskEnd(r->Run()); });
  }
  if (while_running) while_running(runners);
  for (auto& t : threads) t.join();
}

std::string Spec(int stages, const std::string& schedule, int microbatches, int64_t batch,
                 int64_t steps, const std::string& extra = "") {
  return absl::StrCat(
      "name: t\nmodel: {builtin: {family: mlp, sizes: [12, 20, 20, 20, 20, 20, 6], seed: 3}}\n",
      "split: {stages: ", stages, "}\nschedule: {kind: ", schedule,
      ", microbatches: ", microbatches, "}\n", "training: {batch_size: ", batch, ", steps: ", steps,
      ", loss: cross_entropy, optimizer: {kind: sgd, lr: 0.2, momentum: 0.5}", extra, "}\n",
      "data: {seed: 77}\n");
}

testing::ReferenceConfig Reference(int microbatches, int64_t batch, int64_t steps) {
  testing::ReferenceConfig r;
  r.sizes = {12, 20, 20, 20, 20, 20, 6};
  r.model_seed = 3;
  r.data_seed = 77;
  r.batch_size = batch;
  r.microbatches = microbatches;
  r.steps = steps;
  r.loss = "cross_entropy";
  r.optimizer = "sgd";
  r.lr = 0.2;
  r.momentum = 0.5;
  return r;
}

struct Shape {
  std::string schedule;
  int stages;
  int microbatches;
  int64_t batch;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.schedule << " " << s.stages << " stages " << s.microbatches << " microbatches";
}

class TaskRunnerParity : public ::testing::TestWithParam<Shape> {};

TEST_P(TaskRunnerParity, EveryRankMatchesTheReference) {
  const Shape& s = GetParam();
  constexpr int64_t kSteps = 4;
  testing::TempDir dir;
  const std::string spec = Spec(s.stages, s.schedule, s.microbatches, s.batch, kSteps,
                                absl::StrCat(", checkpoint: {dir: ", dir.path(), "}"));
  RecordingReporter reporter;
  RunAll(Assignments(spec, absl::Seconds(30)), &reporter);
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_SUCCEEDED)
        << "rank " << end.rank() << ": " << end.error();
  }
  ASSERT_EQ(reporter.Ends().size(), static_cast<size_t>(s.stages));
  const testing::ReferenceResult ref =
      testing::TrainReference(Reference(s.microbatches, s.batch, kSteps));
  const auto last = reporter.Steps(s.stages - 1);
  ASSERT_EQ(last.size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    double sum = 0;
    for (double l : last[step].microbatch_losses()) sum += l;
    const double loss = sum / s.microbatches;
    EXPECT_NEAR(loss, ref.losses[step], 1e-6 + 1e-5 * std::abs(ref.losses[step])) << step;
  }
  for (int st = 0; st < s.stages; ++st) {
    const auto params = testing::LoadStageFile(testing::StageFilePath(dir.path(), kSteps, st));
    ASSERT_FALSE(params.empty()) << "stage " << st;
    for (const auto& [name, got] : params) {
      ASSERT_EQ(ref.params.count(name), 1u) << name;
      EXPECT_TRUE(torch::allclose(got, ref.params.at(name), 1e-5, 1e-6)) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, TaskRunnerParity,
                         ::testing::Values(Shape{"GPipe", 1, 3, 9}, Shape{"GPipe", 3, 5, 23},
                                           Shape{"1F1B", 3, 3, 12}, Shape{"1F1B", 6, 7, 29},
                                           Shape{"GPipe", 6, 1, 4}, Shape{"1F1B", 2, 8, 8}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat(
                               info.param.schedule == "1F1B" ? "OneFOneB" : info.param.schedule,
                               "_", info.param.stages, "stages_", info.param.microbatches, "mb_",
                               info.param.batch, "rows");
                         });

// training.scale_grads: false leaves the gradients as the sum over microbatches (PyTorch's
// scale_grads=False). With SGD (momentum, no weight decay) that is the reference's training at
// a learning rate m times smaller; ZBV on 2 ranks runs it through I, W and REDUCE_GRAD.
TEST(TaskRunnerScaleGrads, UnscaledGradientsAreTheSumOverMicrobatches) {
  constexpr int kMicrobatches = 4;
  constexpr int64_t kSteps = 3;
  testing::TempDir dir;
  const std::string spec = absl::StrCat(
      "name: t\nmodel: {builtin: {family: mlp, sizes: [12, 20, 20, 20, 20, 20, 6], seed: 3}}\n",
      "split: {stages: 4}\nschedule: {kind: ZBVZeroBubble, microbatches: ", kMicrobatches, "}\n",
      "training: {batch_size: 18, steps: ", kSteps, ", loss: cross_entropy, scale_grads: false, ",
      "optimizer: {kind: sgd, lr: ", 0.2 / kMicrobatches,
      ", momentum: 0.5}, checkpoint: {dir: ", dir.path(), "}}\ndata: {seed: 77}\n");
  RecordingReporter reporter;
  RunAll(Assignments(spec, absl::Seconds(30)), &reporter);
  ASSERT_EQ(reporter.Ends().size(), 2u);
  for (const auto& end : reporter.Ends()) {
    ASSERT_EQ(end.outcome(), v1::TASK_OUTCOME_SUCCEEDED) << end.error();
  }
  const testing::ReferenceResult ref =
      testing::TrainReference(Reference(kMicrobatches, 18, kSteps));  // lr 0.2, scaled
  size_t checked = 0;
  for (int s = 0; s < 4; ++s) {
    for (const auto& [name, got] :
         testing::LoadStageFile(testing::StageFilePath(dir.path(), kSteps, s))) {
      EXPECT_TRUE(torch::allclose(got, ref.params.at(name), 1e-5, 1e-6)) << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, ref.params.size());
}

// Stopping one rank ends it as STOPPED with the reason, and its peers, whose transfers with it
// break, fail promptly naming it instead of waiting out their timeouts. (When the coordinator
// stops a job it stops every rank; reports that arrive after the job ended are ignored.)
TEST(TaskRunnerFailures, StopEndsTheRankAndItsPeersFailPromptlyNamingIt) {
  RecordingReporter reporter;
  const auto tasks = Assignments(Spec(3, "1F1B", 4, 16, 1000000), absl::Seconds(60));
  absl::Time stopped;
  RunAll(tasks, &reporter, [&](std::vector<std::unique_ptr<TaskRunner>>& runners) {
    while (reporter.StepsReported() < 6) absl::SleepFor(absl::Milliseconds(5));
    stopped = absl::Now();
    runners[1]->Stop("test says stop");
  });
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(5));
  ASSERT_EQ(reporter.Ends().size(), 3u);
  for (const auto& end : reporter.Ends()) {
    if (end.rank() == 1) {
      EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_STOPPED) << end.error();
      EXPECT_THAT(end.error(), HasSubstr("test says stop"));
    } else {
      EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_FAILED) << end.error();
      EXPECT_THAT(end.error(), HasSubstr("rank 1")) << "rank " << end.rank();
    }
  }
}

TEST(TaskRunnerFailures, AMissingPeerIsARendezvousTimeoutNamingTheKeys) {
  RecordingReporter reporter;
  auto tasks = Assignments(Spec(2, "GPipe", 2, 8, 1), absl::Seconds(1));
  tasks.pop_back();  // rank 1 never comes
  const absl::Time start = absl::Now();
  RunAll(tasks, &reporter);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_EQ(reporter.Ends().size(), 1u);
  EXPECT_EQ(reporter.Ends()[0].outcome(), v1::TASK_OUTCOME_FAILED);
  EXPECT_THAT(reporter.Ends()[0].error(), HasSubstr("jobs/job-test/attempt-1/"));
}

TEST(TaskRunnerFailures, MismatchedStagesFailAtShapeAgreementNamingStageAndMicrobatch) {
  RecordingReporter reporter;
  // Rank 1 claims layers [3, 6) of a model whose layer 2 ends rank 0's stage: widths differ.
  auto tasks = Assignments(
      absl::StrCat("name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 16, 8, 8, 8, 2]}}\n",
                   "split: {stages: 2}\nschedule: {kind: GPipe, microbatches: 2}\n",
                   "training: {batch_size: 4, steps: 1}\n"),
      absl::Seconds(5));
  tasks[1].mutable_stages(0)->set_first_layer(2);
  RunAll(tasks, &reporter);
  bool named = false;
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_FAILED);
    if (end.rank() == 1) {
      EXPECT_THAT(end.error(),
                  HasSubstr("rank 1, agreeing shapes of stage 1, microbatch 0 (input "
                            "Float[2, 8] from stage 0's output): mat1 and mat2 shapes cannot "
                            "be multiplied"));
      named = true;
    }
  }
  EXPECT_TRUE(named);
}

TEST(TaskRunnerFailures, ALostMessageTimesOutNamingRankActionPeerStageAndMicrobatch) {
  RecordingReporter reporter;
  auto tasks = Assignments(Spec(2, "GPipe", 3, 12, 1), absl::Seconds(1));
  // Drop rank 0's send of microbatch 1's activation.
  auto* actions = tasks[0].mutable_actions();
  for (int i = 0; i < actions->size(); ++i) {
    if (actions->Get(i) == "0SEND_F1") {
      actions->erase(actions->begin() + i);
      break;
    }
  }
  const absl::Time start = absl::Now();
  RunAll(tasks, &reporter);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  std::string rank1_error;
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_FAILED);
    if (end.rank() == 1) rank1_error = end.error();
  }
  EXPECT_THAT(rank1_error, HasSubstr("rank 1, action 1F1: waiting for the activation of stage 1 "
                                     "microbatch 1 from rank 0"));
}

TEST(TaskRunnerFailures, ABadActionStringIsRefusedBeforeAnythingRuns) {
  RecordingReporter reporter;
  auto tasks = Assignments(Spec(1, "GPipe", 1, 4, 1), absl::Seconds(5));
  tasks[0].set_actions(0, "0F0x");
  RunAll(tasks, &reporter);
  ASSERT_EQ(reporter.Ends().size(), 1u);
  EXPECT_THAT(reporter.Ends()[0].error(), HasSubstr("actions[0]: invalid action \"0F0x\""));
}

}  // namespace
}  // namespace stagecoach::runtime
