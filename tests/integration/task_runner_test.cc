// The worker's task runner with ranks as threads: plans from the real planner, stages built
// from the spec, the real Gloo data plane bootstrapped through an in-memory store, and the
// pipeline executor — everything a worker process runs except gRPC. Results are held to the
// single-process reference; failures (a stop, a missing peer, a shape mismatch, a lost
// message) end every rank promptly with an error that names rank, action, peer, stage and
// microbatch.
#include "worker/runtime/task/task_runner.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/time_conversion.h"
#include "common/spec/spec_parser.h"
#include "coordinator/planning/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/forwarding_transport.h"
#include "tests/support/process.h"
#include "tests/support/reference_mlp.h"
#include "tests/support/stage_files.h"
#include "worker/runtime/checkpoint/checkpoint.h"
#include "worker/runtime/executor/forward_actions.h"
#include "worker/runtime/task/tensor_data.h"
#include "worker/runtime/data/training_data.h"
#include "worker/service/task_manager.h"
#include "worker/transport/gloo/factory.h"
#include "worker/transport/in_memory_store.h"

namespace stagecoach::runtime::task_runner_test {
namespace {

using ::testing::HasSubstr;

// Records step reports, and apart from them the checkpoint_only reports (a checkpoint at hold,
// or an asynchronous checkpoint's files once durable).
class RecordingReporter : public TaskReporter {
 public:
  absl::Status ReportStep(const v1::ReportStepRequest& report) override {
    absl::MutexLock lock(&mu_);
    (report.checkpoint_only() ? checkpoints_ : steps_).push_back(report);
    return absl::OkStatus();
  }
  // The checkpoint files `rank` reported for the checkpoint after `global_step` steps, in its
  // step report or a checkpoint_only report.
  int CheckpointFiles(int rank, int64_t global_step) {
    absl::MutexLock lock(&mu_);
    int files = 0;
    for (const auto* list : {&steps_, &checkpoints_}) {
      for (const auto& r : *list) {
        if (r.rank() == rank && r.global_step() == global_step) {
          files += r.checkpoint_files_size();
        }
      }
    }
    return files;
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
  std::vector<v1::ReportStepRequest> checkpoints_;
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
    // What the coordinator sets for a job that runs through: its steps, then the end.
    t.set_step_limit(spec->training.steps);
    t.set_finish_at_limit(true);
    t.add_checkpoint_steps(spec->training.steps);
    *t.mutable_hold_timeout() = rpc::ToProtoDuration(absl::Seconds(30));
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
    TaskRunnerDeps deps;
    deps.worker_id = absl::StrCat("w-", task.rank());
    deps.reporter = reporter;
    deps.store = &store;
    deps.make_transport = GlooFactory();
    runners.push_back(std::make_unique<TaskRunner>(task, std::move(deps)));
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

// --- Step control: the gate, ControlTask and client steps ---

// Waits until `done` holds, at most `timeout`; false when it never did.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

v1::ControlTaskRequest Control(int64_t step_limit, bool finish_at_limit) {
  v1::ControlTaskRequest request;
  request.set_job_id("job-test");
  request.set_attempt(1);
  request.set_step_limit(step_limit);
  request.set_finish_at_limit(finish_at_limit);
  return request;
}

// Every rank's tasks held from the start (step_limit `limit`, no finish) with `checkpoints`.
std::vector<v1::TaskAssignment> HeldAssignments(const std::string& spec, int64_t limit,
                                                std::vector<int64_t> checkpoints = {}) {
  auto tasks = Assignments(spec, absl::Seconds(30));
  for (auto& t : tasks) {
    t.set_step_limit(limit);
    t.set_finish_at_limit(false);
    t.clear_checkpoint_steps();
    for (int64_t c : checkpoints) t.add_checkpoint_steps(c);
  }
  return tasks;
}

double MeanLoss(const v1::ReportStepRequest& report) {
  double sum = 0;
  for (double l : report.microbatch_losses()) sum += l;
  return sum / std::max(1, report.microbatch_losses_size());
}

// A rank's stages ("stage_to_rank" of its task).
bool OwnsStage(const v1::TaskAssignment& task, int stage) {
  for (const auto& st : task.stages()) {
    if (st.stage() == stage) return true;
  }
  return false;
}

// The ControlTask request of a client step for `task`'s rank: inputs to the rank owning stage 0,
// targets (when defined) to the rank owning the last stage, the shape to all.
v1::ControlTaskRequest ClientStepRequest(const v1::TaskAssignment& task, int64_t global_step,
                                         const torch::Tensor& inputs,
                                         const torch::Tensor& targets) {
  const bool forward_only = !targets.defined();
  v1::ControlTaskRequest request = Control(forward_only ? global_step : global_step + 1, false);
  v1::ClientStep* cs = request.mutable_client_step();
  cs->set_global_step(global_step);
  cs->set_forward_only(forward_only);
  for (int64_t d : inputs.sizes()) cs->add_inputs_shape(d);
  cs->set_inputs_dtype(inputs.dtype() == torch::kFloat64 ? "float64" : "float32");
  if (OwnsStage(task, 0)) *cs->mutable_inputs() = *ToTensorData(inputs);
  if (!forward_only && OwnsStage(task, task.num_stages() - 1)) {
    *cs->mutable_targets() = *ToTensorData(targets);
  }
  return request;
}

// A task started below the spec's steps holds there (no more reports, steps_done stays);
// ControlTask raises the limit and it continues on the same data stream, and finish_at_limit
// ends it SUCCEEDED. A limit below the steps done, another attempt, or a client step at the
// wrong step are refused with FAILED_PRECONDITION naming the job and rank.
TEST(TaskRunnerStepControl, HoldsAtTheLimitContinuesWhenRaisedAndFinishes) {
  constexpr int64_t kSteps = 5;
  const std::string spec = Spec(2, "1F1B", 4, 12, kSteps);
  RecordingReporter reporter;
  const auto tasks = HeldAssignments(spec, 2);
  RunAll(tasks, &reporter, [&](std::vector<std::unique_ptr<TaskRunner>>& runners) {
    ASSERT_TRUE(WaitFor([&] { return reporter.StepsReported() == 4; }));
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_EQ(reporter.StepsReported(), 4);
    for (auto& r : runners) EXPECT_EQ(r->steps_done(), 2);
    EXPECT_TRUE(reporter.Ends().empty());

    auto lowered = runners[0]->ControlTask(Control(1, false));
    EXPECT_EQ(lowered.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(lowered.status().message(), HasSubstr("job-test attempt 1 rank 0"));
    EXPECT_THAT(lowered.status().message(), HasSubstr("step_limit 1 is below the 2 steps"));
    v1::ControlTaskRequest other = Control(4, true);
    other.set_attempt(2);
    EXPECT_EQ(runners[1]->ControlTask(other).status().code(),
              absl::StatusCode::kFailedPrecondition);
    for (int64_t at : {1, 3}) {
      auto not_there = runners[0]->ControlTask(
          ClientStepRequest(tasks[0], at, torch::zeros({4, 12}), torch::zeros({4}, torch::kInt64)));
      EXPECT_EQ(not_there.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(not_there.status().message(),
                  HasSubstr(absl::StrCat("client_step.global_step is ", at,
                                         ", but the task holds at step 2")));
    }

    for (auto& r : runners) {
      auto raised = r->ControlTask(Control(4, false));
      ASSERT_TRUE(raised.ok()) << raised.status();
      EXPECT_EQ(raised->global_steps_done(), 2);
    }
    ASSERT_TRUE(WaitFor([&] { return reporter.StepsReported() == 8; }));
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_EQ(reporter.StepsReported(), 8);
    for (auto& r : runners) {
      ASSERT_TRUE(r->ControlTask(Control(kSteps, true)).ok());
    }
  });
  ASSERT_EQ(reporter.Ends().size(), 2u);
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_SUCCEEDED) << end.error();
  }
  // Holding changed nothing: the same losses as a run straight through.
  const testing::ReferenceResult ref = testing::TrainReference(Reference(4, 12, kSteps));
  const auto last = reporter.Steps(1);
  ASSERT_EQ(last.size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(last[step].step(), step);
    EXPECT_EQ(last[step].global_step(), step + 1);
    EXPECT_FALSE(last[step].client_batch());
    EXPECT_NEAR(MeanLoss(last[step]), ref.losses[step], 1e-6 + 1e-5 * std::abs(ref.losses[step]));
  }
}

// A training client step on ranks held at the start runs like a data step on the client's batch
// (another row count than the data's, float64 inputs): its loss and the parameters after it
// equal the reference trained on that batch; the data step after it agrees the data's shapes
// again and runs.
TEST(TaskRunnerStepControl, TrainingClientStepMatchesTheReferenceOnItsBatch) {
  constexpr int kMicrobatches = 4;
  constexpr int64_t kRows = 10;
  testing::TempDir dir;
  const std::string spec =
      Spec(3, "1F1B", kMicrobatches, 8, 2, absl::StrCat(", checkpoint: {dir: ", dir.path(), "}"));
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({kRows, 12}, torch::kFloat64);
  const torch::Tensor y = torch::randint(0, 6, {kRows}, torch::kInt64);
  RecordingReporter reporter;
  const auto tasks = HeldAssignments(spec, 0, {1});
  RunAll(tasks, &reporter, [&](std::vector<std::unique_ptr<TaskRunner>>& runners) {
    for (size_t r = 0; r < runners.size(); ++r) {
      auto taken = runners[r]->ControlTask(ClientStepRequest(tasks[r], 0, x, y));
      ASSERT_TRUE(taken.ok()) << taken.status();
      EXPECT_EQ(taken->global_steps_done(), 0);
    }
    ASSERT_TRUE(WaitFor([&] { return reporter.StepsReported() == 3; }));
    for (auto& r : runners) {
      auto again = r->ControlTask(ClientStepRequest(tasks[0], 0, x, y));
      EXPECT_FALSE(again.ok());  // the task is at step 1 now
    }
    for (auto& r : runners) ASSERT_TRUE(r->ControlTask(Control(2, true)).ok());
  });
  ASSERT_EQ(reporter.Ends().size(), 3u);
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_SUCCEEDED) << end.error();
  }
  testing::ReferenceConfig config = Reference(kMicrobatches, kRows, 1);
  config.dataset_inputs = x.to(torch::kFloat32);
  config.dataset_targets = y;
  const testing::ReferenceResult ref = testing::TrainReference(config);
  const auto last = reporter.Steps(2);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_TRUE(last[0].client_batch());
  EXPECT_EQ(last[0].step(), 0);
  EXPECT_EQ(last[0].global_step(), 1);
  EXPECT_NEAR(MeanLoss(last[0]), ref.losses[0], 1e-6 + 1e-5 * std::abs(ref.losses[0]));
  EXPECT_FALSE(last[1].client_batch());
  EXPECT_EQ(last[1].global_step(), 2);
  std::map<std::string, torch::Tensor> got;
  for (int st = 0; st < 3; ++st) {
    for (auto& [name, t] : testing::LoadStageFile(testing::StageFilePath(dir.path(), 1, st))) {
      got[name] = t;
    }
  }
  testing::ExpectParamsMatchReference(got, ref, 1e-5, 1e-6);
}

// A forward-only client step (DualPipeV: OVERLAP_F_B in the list, rank 0 owns the first and the
// last stage) returns the model's output, one row per input row, and leaves the step count
// where it was; training then goes on as if it had not happened.
TEST(TaskRunnerStepControl, ForwardOnlyClientStepReturnsOutputsAndDoesNotCount) {
  constexpr int kMicrobatches = 4;
  const std::string spec = Spec(4, "DualPipeV", kMicrobatches, 8, 1);
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({7, 12});
  RecordingReporter reporter;
  const auto tasks = HeldAssignments(spec, 0);
  ASSERT_EQ(tasks.size(), 2u);
  bool has_overlap = false;
  for (const auto& a : tasks[0].actions())
    has_overlap |= a.find("OVERLAP_F_B") != std::string::npos;
  EXPECT_TRUE(has_overlap);
  RunAll(tasks, &reporter, [&](std::vector<std::unique_ptr<TaskRunner>>& runners) {
    for (size_t r = 0; r < runners.size(); ++r) {
      auto taken = runners[r]->ControlTask(ClientStepRequest(tasks[r], 0, x, torch::Tensor()));
      ASSERT_TRUE(taken.ok()) << taken.status();
    }
    ASSERT_TRUE(WaitFor([&] { return reporter.StepsReported() == 2; }));
    for (auto& r : runners) EXPECT_EQ(r->steps_done(), 0);
    for (auto& r : runners) ASSERT_TRUE(r->ControlTask(Control(1, true)).ok());
  });
  ASSERT_EQ(reporter.Ends().size(), 2u);
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_SUCCEEDED) << end.error();
  }
  const auto rank0 = reporter.Steps(0);
  ASSERT_EQ(rank0.size(), 2u);
  EXPECT_TRUE(rank0[0].forward_only_step());
  EXPECT_TRUE(rank0[0].client_batch());
  EXPECT_EQ(rank0[0].step(), 0);
  EXPECT_EQ(rank0[0].global_step(), 0);
  auto outputs = FromTensorData(rank0[0].outputs(), "outputs");
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_EQ(outputs->sizes().vec(), (std::vector<int64_t>{7, 6}));
  const torch::Tensor want = testing::ReferenceForward({12, 20, 20, 20, 20, 20, 6}, 3, x);
  EXPECT_TRUE(torch::allclose(*outputs, want, 1e-5, 1e-6));
  for (const auto& a : rank0[0].executed_actions()) {
    EXPECT_THAT(a,
                ::testing::Not(::testing::AnyOf(HasSubstr("B"), HasSubstr("W"), HasSubstr("I"))));
  }
  EXPECT_FALSE(reporter.Steps(1)[0].has_outputs());
  // The data step after it is the job's step 0.
  EXPECT_FALSE(rank0[1].forward_only_step());
  EXPECT_EQ(rank0[1].global_step(), 1);
  const testing::ReferenceResult ref = testing::TrainReference(Reference(kMicrobatches, 8, 1));
  EXPECT_NEAR(MeanLoss(rank0[1]), ref.losses[0], 1e-6 + 1e-5 * std::abs(ref.losses[0]));
}

TEST(TaskRunnerStepControl, MalformedClientStepsAreInvalidArguments) {
  const std::string spec = Spec(2, "GPipe", 4, 8, 1);
  RecordingReporter reporter;
  const auto tasks = HeldAssignments(spec, 0);
  RunAll(tasks, &reporter, [&](std::vector<std::unique_ptr<TaskRunner>>& runners) {
    const torch::Tensor x = torch::zeros({8, 12});
    const torch::Tensor y = torch::zeros({8}, torch::kInt64);
    auto expect_invalid = [&](int rank, v1::ControlTaskRequest request, const std::string& what) {
      auto got = runners[rank]->ControlTask(request);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << what;
      EXPECT_THAT(got.status().message(), HasSubstr(what));
    };
    v1::ControlTaskRequest request = ClientStepRequest(tasks[0], 0, x, y);
    request.set_step_limit(0);
    expect_invalid(0, request, "step_limit");
    expect_invalid(1, ClientStepRequest(tasks[0], 0, x, y), "client_step.inputs: only for");
    expect_invalid(0, ClientStepRequest(tasks[1], 0, x, y), "client_step.inputs: required");
    request = ClientStepRequest(tasks[1], 0, x, y);
    request.mutable_client_step()->clear_targets();
    expect_invalid(1, request, "client_step.targets: required");
    request = ClientStepRequest(tasks[0], 0, torch::zeros({3, 12}), y);
    expect_invalid(0, request, "fewer than the job's 4 microbatches");
    request.mutable_client_step()->clear_inputs_shape();
    expect_invalid(0, request, "client_step.inputs_shape: required");
    // Nothing was taken: the ranks still hold, and end when told.
    for (auto& r : runners) ASSERT_TRUE(r->ControlTask(Control(0, true)).ok());
  });
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_SUCCEEDED) << end.error();
  }
  EXPECT_EQ(reporter.StepsReported(), 0);
}

// A batch stage 0 cannot take (13 features for a 12-feature model) is refused by the rank
// owning stage 0 with INVALID_ARGUMENT, checked while every rank holds (the check waits for the
// rank's set-up); nothing changes: the same step then takes a batch that fits.
TEST(TaskRunnerStepControl, ABatchStageZeroCannotTakeIsRefusedWhileEveryRankHolds) {
  const std::string spec = Spec(2, "GPipe", 4, 8, 1);
  RecordingReporter reporter;
  const auto tasks = HeldAssignments(spec, 0);
  ASSERT_TRUE(OwnsStage(tasks[0], 0));
  RunAll(tasks, &reporter, [&](std::vector<std::unique_ptr<TaskRunner>>& runners) {
    const torch::Tensor y = torch::zeros({8}, torch::kInt64);
    auto refused =
        runners[0]->ControlTask(ClientStepRequest(tasks[0], 0, torch::zeros({8, 13}), y));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(refused.status().message(),
                HasSubstr("client_step.inputs (rank 0): stage 0 cannot take microbatch 0 of "
                          "shape [2, 13]"));
    EXPECT_EQ(reporter.StepsReported(), 0);
    for (size_t r = 0; r < runners.size(); ++r) {
      auto taken =
          runners[r]->ControlTask(ClientStepRequest(tasks[r], 0, torch::zeros({8, 12}), y));
      ASSERT_TRUE(taken.ok()) << taken.status();
      EXPECT_EQ(taken->global_steps_done(), 0);
    }
    ASSERT_TRUE(WaitFor([&] { return reporter.StepsReported() == 2; }));
    for (auto& r : runners) ASSERT_TRUE(r->ControlTask(Control(1, true)).ok());
  });
  ASSERT_EQ(reporter.Ends().size(), 2u);
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_SUCCEEDED) << end.error();
  }
  for (const auto& step : reporter.Steps(1)) EXPECT_TRUE(step.client_batch());
}

TEST(TaskRunnerStepControl, HoldingLongerThanHoldTimeoutFailsTheTask) {
  RecordingReporter reporter;
  auto tasks = HeldAssignments(Spec(2, "GPipe", 2, 8, 3), 1);
  for (auto& t : tasks) *t.mutable_hold_timeout() = rpc::ToProtoDuration(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  RunAll(tasks, &reporter);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_EQ(reporter.Ends().size(), 2u);
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_FAILED);
    EXPECT_THAT(end.error(), HasSubstr(absl::StrCat("rank ", end.rank(),
                                                    " held at step 1 for longer than "
                                                    "hold_timeout (300ms) without a ControlTask")));
  }
  EXPECT_EQ(reporter.StepsReported(), 2);
}

// Checkpoints are written after the requested steps only (no every_steps, no implicit last
// step): the assignment's, ControlTask's and RequestCheckpoint's, which add up.
TEST(TaskRunnerStepControl, CheckpointStepsWriteCheckpointsOnlyThere) {
  testing::TempDir dir;
  const std::string spec =
      Spec(2, "GPipe", 2, 8, 6, absl::StrCat(", checkpoint: {dir: ", dir.path(), "}"));
  RecordingReporter reporter;
  const auto tasks = HeldAssignments(spec, 3, {2});
  RunAll(tasks, &reporter, [&](std::vector<std::unique_ptr<TaskRunner>>& runners) {
    ASSERT_TRUE(WaitFor([&] { return reporter.StepsReported() == 6; }));
    for (auto& r : runners) {
      ASSERT_TRUE(r->RequestCheckpoint(4).ok());
      ASSERT_TRUE(r->RequestCheckpoint(6).ok());
      EXPECT_EQ(r->RequestCheckpoint(3).code(), absl::StatusCode::kFailedPrecondition);
      v1::ControlTaskRequest request = Control(6, true);
      request.add_checkpoint_steps(5);
      ASSERT_TRUE(r->ControlTask(request).ok());
    }
  });
  for (const auto& end : reporter.Ends()) {
    EXPECT_EQ(end.outcome(), v1::TASK_OUTCOME_SUCCEEDED) << end.error();
  }
  for (int64_t step = 1; step <= 6; ++step) {
    const bool want = step == 2 || step == 4 || step == 5 || step == 6;
    for (int st = 0; st < 2; ++st) {
      EXPECT_EQ(std::filesystem::exists(testing::StageFilePath(dir.path(), step, st)), want)
          << "step " << step << " stage " << st;
    }
    EXPECT_EQ(reporter.CheckpointFiles(1, step) > 0, want) << step;
  }
}

// A reporter whose ReportTaskEnd blocks (a slow coordinator) until released.
class SlowEndReporter : public TaskReporter {
 public:
  absl::Status ReportStep(const v1::ReportStepRequest&) override { return absl::OkStatus(); }
  absl::Status ReportTaskEnd(const v1::ReportTaskEndRequest&) override {
    if (!ended_.HasBeenNotified()) ended_.Notify();
    release_.WaitForNotificationWithTimeout(absl::Seconds(10));
    return absl::OkStatus();
  }
  absl::Notification ended_;
  absl::Notification release_;
};

// While a finished task's thread is still reporting its end, the manager's Status (what
// heartbeats send) answers at once, also while Start waits to join that thread.
TEST(TaskManagerReaping, StatusDoesNotWaitForAFinishedTaskReportingItsEnd) {
  SlowEndReporter reporter;
  transport::InMemoryStore store;
  worker::TaskManagerDeps deps;
  deps.reporter = &reporter;
  deps.store = &store;
  deps.make_transport = GlooFactory();
  deps.worker_id = [] { return std::string("w-0"); };
  auto tasks = Assignments(Spec(1, "GPipe", 1, 4, 1), absl::Seconds(10));
  {
    worker::TaskManager manager(deps);
    ASSERT_TRUE(manager.Start(tasks[0]).ok());
    ASSERT_TRUE(reporter.ended_.WaitForNotificationWithTimeout(absl::Seconds(20)));
    v1::TaskAssignment next = tasks[0];
    next.set_attempt(2);
    next.set_rendezvous_prefix("jobs/job-test/attempt-2/");
    next.set_step_limit(0);  // holds until the manager stops it
    next.set_finish_at_limit(false);
    std::thread starter([&] { EXPECT_TRUE(manager.Start(next).ok()); });
    absl::SleepFor(absl::Milliseconds(200));  // Start is now waiting for the old thread
    const absl::Time asked = absl::Now();
    const v1::GetWorkerStatusResponse status = manager.Status();
    EXPECT_LT(absl::Now() - asked, absl::Milliseconds(500));
    EXPECT_EQ(status.job_id(), "job-test");  // the next task is running
    reporter.release_.Notify();
    starter.join();
  }
}

// A transport whose Abort blocks until released (a data plane slow to tear down); everything
// else goes to the real one.
class SlowAbortTransport : public testing::ForwardingTransport {
 public:
  SlowAbortTransport(std::unique_ptr<transport::Transport> inner, absl::Notification* aborting,
                     absl::Notification* release)
      : ForwardingTransport(std::move(inner)), aborting_(aborting), release_(release) {}
  void Abort() override {
    if (!aborting_->HasBeenNotified()) aborting_->Notify();
    release_->WaitForNotificationWithTimeout(absl::Seconds(30));
    inner().Abort();
  }

 private:
  absl::Notification* aborting_;
  absl::Notification* release_;
};

// While a Stop waits on the task's data plane to abort, the manager's Status (what heartbeats
// send) still answers: a worker stuck tearing down keeps its lease and can learn it was
// forgotten. Latches, not timers: Status runs while Abort is known to be blocked.
TEST(TaskManagerStopping, StatusAnswersWhileAStopWaitsOnTheDataPlane) {
  RecordingReporter reporter;
  transport::InMemoryStore store;
  absl::Notification made_plane;  // the task has its data plane
  absl::Notification aborting;
  absl::Notification release;
  worker::TaskManagerDeps deps;
  deps.reporter = &reporter;
  deps.store = &store;
  deps.make_transport = [&, inner = GlooFactory()](const TransportRequest& request,
                                                   transport::RendezvousStore* s)
      -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
    auto made = inner(request, s);
    if (!made.ok()) return made.status();
    auto slow = std::make_unique<SlowAbortTransport>(*std::move(made), &aborting, &release);
    made_plane.Notify();
    return slow;
  };
  deps.worker_id = [] { return std::string("w-0"); };
  auto tasks = Assignments(Spec(1, "GPipe", 1, 4, 1), absl::Seconds(10));
  tasks[0].set_step_limit(0);  // holds at its first step boundary until stopped
  tasks[0].set_finish_at_limit(false);
  worker::TaskManager manager(deps);
  ASSERT_TRUE(manager.Start(tasks[0]).ok());
  // Stopped once it has a data plane (stopped earlier, its rendezvous is cancelled instead).
  ASSERT_TRUE(made_plane.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::Status stopped;
  std::thread stopper([&] { stopped = manager.Stop("job-test", "test", absl::Seconds(30)); });
  ASSERT_TRUE(aborting.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the task never reached its data plane";
  // Status answers while Abort is still blocked (the bound only matters when it does not:
  // then it would wait for the release below).
  v1::GetWorkerStatusResponse status;
  absl::Notification answered;
  std::thread heartbeat([&] {
    status = manager.Status();
    answered.Notify();
  });
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "Status waited for the data plane's abort";
  release.Notify();
  heartbeat.join();
  EXPECT_EQ(status.job_id(), "job-test");
  stopper.join();
  EXPECT_TRUE(stopped.ok()) << stopped;
  EXPECT_EQ(manager.Status().job_id(), "");
}

TEST(ForwardActions, KeepsForwardsAndTheirTransfersInOrder) {
  std::vector<schedule::Action> actions;
  for (const char* text : {"0RECV_F0", "0F0", "0SEND_F0", "(0F1;2B0)OVERLAP_F_B", "0RECV_B0", "0B0",
                           "0I1", "0W1", "0SEND_B0", "0REDUCE_GRAD", "0SEND_F1"}) {
    actions.push_back(*schedule::ParseRequiredAction(text));
  }
  std::vector<std::string> got;
  for (const auto& a : ForwardActions(actions)) got.push_back(a.ToString());
  EXPECT_EQ(got, (std::vector<std::string>{"0RECV_F0", "0F0", "0SEND_F0", "0F1", "0SEND_F1"}));
}

}  // namespace
}  // namespace stagecoach::runtime::task_runner_test
