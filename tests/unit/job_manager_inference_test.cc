// JobManager's Infer with fake workers: the batch goes to the rank owning stage 0 of a one-step
// ForwardOnly job, the last stage's outputs come back; bad inputs are refused before anything is
// queued; timeouts, departed callers and failures end the call and the job. Also the measured
// bubble ratios of step reports.
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/spec/spec_parser.h"
#include "coordinator/job_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::job_manager_inference_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A spec written for training: Infer keeps its model, split and microbatches only.
std::string Spec(int stages, int microbatches = 4) {
  return absl::StrCat("name: inf\nmodel: {builtin: {family: mlp, sizes: [4, 8, 8, 8, 2]}}\n",
                      "split: {stages: ", stages, "}\n",
                      "schedule: {kind: 1F1B, microbatches: ", microbatches, "}\n",
                      "training: {batch_size: 2, steps: 9, checkpoint: {dir: /ckpt}}\n");
}

v1::TensorData Floats(int64_t rows, int64_t cols) {
  v1::TensorData t;
  t.set_dtype("float32");
  t.add_shape(rows);
  t.add_shape(cols);
  std::vector<float> values(rows * cols);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  t.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  return t;
}

// Infer runs on its own thread: allow it more time than the other manager tests.
constexpr absl::Duration kPoll = absl::Seconds(5);

class JobManagerInferenceTest : public JobManagerFixture {
 protected:
  ~JobManagerInferenceTest() override {
    if (call_.joinable()) call_.join();
  }

  // Calls Infer on a thread (it blocks until the job ends); Result() joins it.
  void StartInfer(std::string spec, v1::TensorData inputs, absl::Duration timeout,
                  std::function<bool()> caller_gone = nullptr) {
    call_ = std::thread([=, this] {
      result_ = manager_->Infer(spec, "infer.yaml", inputs, timeout, caller_gone);
      returned_.Notify();
    });
  }
  // Runs the manager's queued work (failure investigations, stops) until the call returns.
  absl::StatusOr<InferenceResult> Result() {
    const absl::Time deadline = absl::Now() + kPoll;
    while (!returned_.WaitForNotificationWithTimeout(absl::Milliseconds(1)) &&
           absl::Now() < deadline) {
      Settle();
    }
    call_.join();
    return result_;
  }
  std::string OnlyJob() {
    std::vector<v1::Job> jobs = manager_->ListJobs();
    EXPECT_EQ(jobs.size(), 1u);
    return jobs.empty() ? "" : jobs[0].id();
  }
  v1::Job Job(const std::string& id) { return *manager_->GetJob(id); }

  absl::Status Step(const std::string& job, const std::string& worker, int rank, int step,
                    double bubble) {
    v1::ReportStepRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_step(step);
    r.add_executed_actions("0F0");
    r.add_action_timings()->set_end_us(5);
    r.set_bubble_ratio(bubble);
    return manager_->ReportStep(r);
  }
  absl::Status End(const std::string& job, const std::string& worker, int rank,
                   v1::TaskOutcome outcome, const v1::TensorData* outputs = nullptr,
                   const std::string& error = "") {
    v1::ReportTaskEndRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_outcome(outcome);
    r.set_error(error);
    if (outputs != nullptr) *r.mutable_inference_outputs() = *outputs;
    return manager_->ReportTaskEnd(r);
  }
  std::thread call_;
  absl::Notification returned_;
  absl::StatusOr<InferenceResult> result_ = absl::UnknownError("not called");
};

TEST_F(JobManagerInferenceTest, TheBatchGoesToStageZeroAndTheLastStagesOutputsComeBack) {
  const std::string w1 = Register(1), w2 = Register(2);
  StartInfer(Spec(2), Floats(10, 4), absl::Seconds(30));
  ASSERT_TRUE(Eventually(
      [&] {
        return !workers_.Started(Address(1)).empty() && !workers_.Started(Address(2)).empty();
      },
      kPoll));
  const std::string id = OnlyJob();
  const v1::TaskAssignment t0 = workers_.Started(Address(1))[0];
  const v1::TaskAssignment t1 = workers_.Started(Address(2))[0];
  EXPECT_TRUE(t0.forward_only());
  EXPECT_TRUE(t1.forward_only());
  ASSERT_TRUE(t0.has_inference());
  ASSERT_TRUE(t1.has_inference());
  EXPECT_EQ(t0.inference().inputs().data(), Floats(10, 4).data());
  EXPECT_FALSE(t1.inference().has_inputs()) << "only stage 0 needs the batch";
  for (const auto& a : t0.actions()) EXPECT_EQ(a.find('B'), std::string::npos) << a;

  // The workers' spec: ForwardOnly, the batch's rows, one step, no checkpoints.
  auto spec = spec::ParseJobSpec(t0.spec_yaml());
  ASSERT_TRUE(spec.ok()) << spec.status() << t0.spec_yaml();
  EXPECT_EQ(spec->schedule.kind, "ForwardOnly");
  EXPECT_EQ(spec->schedule.microbatches, 4);
  EXPECT_EQ(spec->training.batch_size, 10);
  EXPECT_EQ(spec->training.steps, 1);
  EXPECT_EQ(spec->training.checkpoint.dir, "");

  ASSERT_TRUE(Eventually([&] { return Job(id).state() == v1::JOB_STATE_RUNNING; }, kPoll));
  ASSERT_TRUE(Step(id, w1, 0, 0, 0.25).ok());
  ASSERT_TRUE(Step(id, w2, 1, 0, 0.5).ok()) << "forward-only steps report no losses";
  EXPECT_EQ(Job(id).steps_done(), 1);
  EXPECT_TRUE(Job(id).losses().empty());
  EXPECT_THAT(Job(id).max_bubble_ratios(), ElementsAre(0.5));

  const v1::TensorData outputs = Floats(10, 2);
  ASSERT_TRUE(End(id, w1, 0, v1::TASK_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(End(id, w2, 1, v1::TASK_OUTCOME_SUCCEEDED, &outputs).ok());
  auto result = Result();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->job_id, id);
  EXPECT_EQ(result->outputs.SerializeAsString(), outputs.SerializeAsString());
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.schedule(), "ForwardOnly");
  EXPECT_EQ(job.steps_total(), 1);
}

TEST_F(JobManagerInferenceTest, BadInputsAreRefusedNamingTheFieldAndNothingIsQueued) {
  Register(1);
  Register(2);
  auto refused = [&](v1::TensorData inputs, const std::string& spec, const std::string& why) {
    auto r = manager_->Infer(spec, "infer.yaml", inputs, absl::Seconds(1));
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(why));
  };
  v1::TensorData unknown = Floats(4, 4);
  unknown.set_dtype("bfloat16");
  refused(unknown, Spec(2), "inputs.dtype: must be float32, float64, int64 or int32");
  v1::TensorData short_data = Floats(4, 4);
  short_data.mutable_data()->resize(10);
  refused(short_data, Spec(2), "inputs.data: float32[4, 4] needs 64 bytes, got 10");
  v1::TensorData scalar = Floats(1, 1);
  scalar.clear_shape();
  scalar.mutable_data()->resize(4);
  refused(scalar, Spec(2), "inputs.shape: needs at least one row");
  refused(Floats(0, 4), Spec(2), "inputs.shape: needs at least one row");
  refused(Floats(3, 4), Spec(2, 4),
          "schedule.microbatches: must be <= the rows of inputs (float32[3, 4]), got 4");
  refused(Floats(8, 4), "model: {builtin: {family: mlp, sizes: [4, 2]}}\n", "name: required");
  refused(Floats(8, 4), "name: [", "infer.yaml:1:");
  EXPECT_TRUE(manager_->ListJobs().empty());
}

TEST_F(JobManagerInferenceTest, AJobThatDoesNotEndInTimeIsCancelled) {
  // No workers: the job waits in the queue until the call gives up.
  StartInfer(Spec(2), Floats(8, 4), absl::Milliseconds(300));
  // The call's deadline is on the manager's clock: it passes once the job is queued.
  ASSERT_TRUE(Eventually([&] { return manager_->ListJobs().size() == 1; }, kPoll));
  clock_.Advance(absl::Milliseconds(300));
  auto result = Result();
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr("did not finish within 300ms"));
  const v1::Job job = Job(OnlyJob());
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(job.reason(), HasSubstr("did not finish within 300ms"));
}

TEST_F(JobManagerInferenceTest, ACallerThatGoesAwayCancelsTheJob) {
  std::atomic<bool> gone{false};
  StartInfer(Spec(2), Floats(8, 4), absl::Seconds(30), [&] { return gone.load(); });
  ASSERT_TRUE(Eventually([&] { return manager_->ListJobs().size() == 1; }, kPoll));
  gone = true;
  auto result = Result();
  EXPECT_TRUE(absl::IsCancelled(result.status())) << result.status();
  EXPECT_EQ(Job(OnlyJob()).state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerInferenceTest, AFailedJobIsTheCallsErrorWithItsReason) {
  const std::string w1 = Register(1), w2 = Register(2);
  StartInfer(Spec(2), Floats(8, 4), absl::Seconds(30));
  ASSERT_TRUE(Eventually([&] { return manager_->ListJobs().size() == 1; }, kPoll));
  const std::string id = OnlyJob();
  ASSERT_TRUE(Eventually([&] { return Job(id).state() == v1::JOB_STATE_RUNNING; }, kPoll));
  ASSERT_TRUE(End(id, w1, 0, v1::TASK_OUTCOME_FAILED, nullptr,
                  "rank 0, action 0F0: stage 0 microbatch 0: expected [2, 4], got [2, 3]")
                  .ok());
  auto result = Result();
  EXPECT_TRUE(absl::IsAborted(result.status())) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr(id + " failed: rank 0"));
  EXPECT_THAT(result.status().message(), HasSubstr("stage 0 microbatch 0"));
}

TEST_F(JobManagerInferenceTest, OutputsWithoutARowPerInputRowFailTheJob) {
  const std::string w1 = Register(1), w2 = Register(2);
  StartInfer(Spec(2), Floats(8, 4), absl::Seconds(30));
  ASSERT_TRUE(Eventually([&] { return manager_->ListJobs().size() == 1; }, kPoll));
  const std::string id = OnlyJob();
  ASSERT_TRUE(Eventually([&] { return Job(id).state() == v1::JOB_STATE_RUNNING; }, kPoll));
  const v1::TensorData outputs = Floats(6, 2);
  ASSERT_TRUE(End(id, w2, 1, v1::TASK_OUTCOME_SUCCEEDED, &outputs).ok());
  auto result = Result();
  EXPECT_TRUE(absl::IsAborted(result.status())) << result.status();
  EXPECT_THAT(result.status().message(),
              HasSubstr("unusable inference outputs: inference_outputs: expected 8 rows"));
}

TEST_F(JobManagerInferenceTest, TrainingStepsCarryEveryRanksBubbleRatio) {
  const std::string w1 = Register(1), w2 = Register(2);
  auto id = manager_->SubmitJob(
      "name: t\nmodel: {builtin: {family: mlp, sizes: [4, 8, 2]}}\nsplit: {stages: 2}\n"
      "schedule: {kind: GPipe, microbatches: 2}\ntraining: {batch_size: 4, steps: 2}\n",
      "t.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(Eventually([&] { return Job(*id).state() == v1::JOB_STATE_RUNNING; }, kPoll));
  v1::ReportStepRequest r;
  r.set_worker_id(w2);
  r.set_job_id(*id);
  r.set_attempt(1);
  r.set_rank(1);
  r.add_microbatch_losses(1.0);
  r.add_microbatch_losses(3.0);
  r.add_executed_actions("1F0");
  r.add_executed_actions("1F1");
  r.add_action_timings();  // one timing for two actions
  r.set_bubble_ratio(0.4);
  auto mismatch = manager_->ReportStep(r);
  EXPECT_TRUE(absl::IsInvalidArgument(mismatch)) << mismatch;
  EXPECT_THAT(mismatch.message(), HasSubstr("action_timings: expected one per executed action"));
  r.add_action_timings();
  ASSERT_TRUE(manager_->ReportStep(r).ok());
  r.set_worker_id(w1);
  r.set_rank(0);
  r.clear_microbatch_losses();
  r.set_bubble_ratio(0.1);
  ASSERT_TRUE(manager_->ReportStep(r).ok());
  const v1::Job job = Job(*id);
  EXPECT_THAT(job.losses(), ElementsAre(2.0));
  EXPECT_THAT(job.max_bubble_ratios(), ElementsAre(0.4));
  auto events = manager_->WaitForEvents(*id, 0, absl::ZeroDuration());
  ASSERT_TRUE(events.ok());
  const v1::StepCompleted* step = nullptr;
  for (const auto& e : events->events) {
    if (e.has_step_completed()) step = &e.step_completed();
  }
  ASSERT_NE(step, nullptr);
  EXPECT_TRUE(step->has_loss());
  EXPECT_THAT(step->bubble_ratios(), ElementsAre(0.1, 0.4));
}

}  // namespace
}  // namespace stagecoach::coordinator::job_manager_inference_test
