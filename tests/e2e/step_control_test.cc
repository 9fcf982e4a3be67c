// Step control end to end (issue 6) with a real coordinator, two worker processes and stagectl:
//   - PauseJob holds the same job (same id, workers, attempt) at the step it names, and
//     ResumeJob carries it through with the losses of the unpipelined reference;
//   - a job submitted paused runs `stagectl run --steps N` and holds again; RunSteps past
//     steps_total extends it;
//   - StepJob on client batches: a training step's loss and a forward-only step's outputs equal
//     the plain-LibTorch reference on the same batch and weights; errors for a RUNNING job and
//     for targets of the wrong row count;
//   - CheckpointJob on a running job still writes a complete checkpoint;
//   - GetJobSchedule agrees with GetJob's assigned actions, and GetStepTrace's measured trace is
//     causal (every transfer arrives after it starts, after its producer and before its consumer
//     ends), and `stagectl trace` writes the same bytes;
//   - `stagectl watch -o json` streams step events with loss and throughput, ending SUCCEEDED.
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/rpc/channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"
#include "tests/support/npy_files.h"
#include "tests/support/reference_mlp.h"

namespace stagecoach::testing::step_control_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// The MLP every test trains: 2 stages on 2 workers, 1F1B, 4 microbatches, SGD.
ReferenceConfig Config(int64_t steps) { return SmallSgdMlp(steps, 11, 5); }

v1::TensorData ToTensorData(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kFloat32).contiguous();
  v1::TensorData d;
  d.set_dtype("float32");
  for (int64_t s : c.sizes()) d.add_shape(s);
  d.set_data(std::string(static_cast<const char*>(c.data_ptr()), c.nbytes()));
  return d;
}

// The MLP's output with explicit parameters ("{i}.weight", "{i}.bias"), ReLU between layers.
torch::Tensor ForwardWith(const std::map<std::string, torch::Tensor>& params, size_t layers,
                          const torch::Tensor& x) {
  torch::Tensor h = x;
  for (size_t i = 0; i < layers; ++i) {
    h = torch::addmm(params.at(absl::StrCat(i, ".bias")), h,
                     params.at(absl::StrCat(i, ".weight")).t());
    if (i + 1 < layers) h = torch::relu(h);
  }
  return h;
}

void ExpectLossesMatch(const v1::Job& job, const std::vector<double>& ref) {
  ASSERT_EQ(job.losses_size(), static_cast<int>(ref.size()));
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(job.losses(static_cast<int>(i)), ref[i], kAtol + kRtol * std::abs(ref[i]))
        << "step " << i;
  }
}

class StepControl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.workers = 2;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    stub_ = v1::CoordinatorService::NewStub(rpc::MakeChannel(cluster_->coordinator_address()))
                .release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    stub_ = nullptr;
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    ASSERT_TRUE(cluster_->WaitForIdleWorkers(2, absl::Seconds(30)).ok()) << cluster_->Logs();
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_->Logs();
  }

  LocalCluster& c() { return *cluster_; }

  std::string Spec(const std::string& name, int64_t steps) {
    return MlpSpecYaml(Config(steps), {name, "1F1B", 2, 2, 4}, c().dir() + "/ckpt-" + name);
  }

  // Submits `spec_yaml` over the RPC; returns the job id (empty on failure, with a test failure).
  std::string Submit(const std::string& spec_yaml, bool paused) {
    absl::StatusOr<std::string> id = c().Submit(spec_yaml, paused);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }

  absl::StatusOr<v1::Job> WaitForState(const std::string& id, v1::JobState state,
                                       int64_t steps_done = -1,
                                       absl::Duration timeout = absl::Seconds(60)) {
    return c().WaitForJob(
        id,
        [&](const v1::Job& j) {
          return IsFinal(j) ||
                 (j.state() == state && (steps_done < 0 || j.steps_done() == steps_done));
        },
        timeout);
  }

  grpc::Status StepJob(const v1::StepJobRequest& req, v1::StepJobResponse* resp) {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(90));
    return stub_->StepJob(&ctx, req, resp);
  }

  void Cancel(const std::string& id) {
    absl::Status cancelled = c().Cancel(id);
    EXPECT_TRUE(cancelled.ok()) << cancelled;
  }

  static LocalCluster* cluster_;
  static v1::CoordinatorService::Stub* stub_;
};

LocalCluster* StepControl::cluster_ = nullptr;
v1::CoordinatorService::Stub* StepControl::stub_ = nullptr;

// Long enough that the job is still running when the test pauses it after a few steps.
constexpr int64_t kLongSteps = 600;

TEST_F(StepControl, PauseHoldsTheSameJobAndResumeContinuesIt) {
  const std::string id = Submit(Spec("pause", kLongSteps), false);
  ASSERT_FALSE(id.empty());
  auto running = c().WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.steps_done() >= 3; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << running->reason();

  v1::PauseJobRequest pause_req;
  pause_req.set_job_id(id);
  v1::PauseJobResponse pause;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    grpc::Status s = stub_->PauseJob(&ctx, pause_req, &pause);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const int64_t held = pause.global_step();
  EXPECT_GE(held, 3);
  EXPECT_LT(held, kLongSteps);
  auto paused = WaitForState(id, v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(paused.ok()) << paused.status();
  ASSERT_EQ(paused->state(), v1::JOB_STATE_PAUSED) << paused->reason();
  EXPECT_EQ(paused->steps_done(), held);  // no resumed checkpoint: base 0
  EXPECT_EQ(paused->global_steps_done(), held);
  EXPECT_EQ(paused->pause_at_global_step(), held);
  EXPECT_EQ(paused->losses_size(), held);
  // Pausing again names the same step.
  {
    v1::PauseJobResponse again;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    ASSERT_TRUE(stub_->PauseJob(&ctx, pause_req, &again).ok());
    EXPECT_EQ(again.global_step(), held);
  }

  // Held: nothing moves for a second, and it is the same job on the same workers.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  auto still = c().GetJob(id);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(still->steps_done(), held);
  EXPECT_EQ(still->global_steps_done(), held);
  EXPECT_EQ(still->id(), id);
  EXPECT_EQ(still->attempt(), 1);
  EXPECT_EQ(still->restarts(), 0);
  ASSERT_EQ(still->ranks_size(), 2);
  ASSERT_EQ(running->ranks_size(), 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(still->ranks(r).worker_id(), running->ranks(r).worker_id()) << "rank " << r;
    EXPECT_EQ(still->ranks(r).steps_done(), held) << "rank " << r;
  }
  auto workers = c().ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  for (const v1::WorkerInfo& w : *workers) {
    EXPECT_EQ(w.state(), v1::WORKER_STATE_BUSY) << w.id();
    EXPECT_EQ(w.job_id(), id) << w.id();
  }
  CommandResult list = c().Stagectl({"list", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  int jobs_with_name = 0;
  for (const auto& j : nlohmann::json::parse(list.out)) jobs_with_name += j["name"] == "pause";
  EXPECT_EQ(jobs_with_name, 1) << "no resubmission";

  v1::ResumeJobRequest resume_req;
  resume_req.set_job_id(id);
  v1::ResumeJobResponse resume;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    grpc::Status s = stub_->ResumeJob(&ctx, resume_req, &resume);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_TRUE(resume.job().state() == v1::JOB_STATE_RUNNING ||
              resume.job().state() == v1::JOB_STATE_SUCCEEDED)
      << v1::JobState_Name(resume.job().state());
  EXPECT_EQ(resume.job().pause_at_global_step(), 0);
  auto done = c().WaitForJob(id, IsFinal, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason();
  EXPECT_EQ(done->steps_done(), kLongSteps);
  EXPECT_EQ(done->global_steps_done(), kLongSteps);
  EXPECT_EQ(done->attempt(), 1);
  ExpectLossesMatch(*done, TrainReference(Config(kLongSteps)).losses);

  EXPECT_THAT(StatesOf(*done), ::testing::ElementsAre(v1::JOB_STATE_PLANNING, v1::JOB_STATE_PENDING,
                                                      v1::JOB_STATE_STARTING, v1::JOB_STATE_RUNNING,
                                                      v1::JOB_STATE_PAUSED, v1::JOB_STATE_RUNNING,
                                                      v1::JOB_STATE_SUCCEEDED));
  // A job that has ended can be neither paused nor resumed.
  {
    v1::PauseJobResponse late;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    EXPECT_EQ(stub_->PauseJob(&ctx, pause_req, &late).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    EXPECT_EQ(stub_->ResumeJob(&ctx, resume_req, &resume).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
}

TEST_F(StepControl, RunStepsHoldsAgainAndExtendsStepsTotal) {
  const std::string spec = c().WriteFile("runsteps.yaml", Spec("runsteps", 6));
  CommandResult submit = c().Stagectl({"submit", spec, "--paused"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = LastLine(submit.out);
  auto held0 = WaitForState(id, v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(held0.ok()) << held0.status();
  ASSERT_EQ(held0->state(), v1::JOB_STATE_PAUSED) << held0->reason();
  EXPECT_EQ(held0->steps_done(), 0);
  EXPECT_EQ(held0->global_steps_done(), 0);
  EXPECT_EQ(held0->losses_size(), 0);
  EXPECT_EQ(held0->steps_total(), 6);
  // Started held: STARTING -> PAUSED, never RUNNING.
  EXPECT_THAT(StatesOf(*held0),
              ::testing::ElementsAre(v1::JOB_STATE_PLANNING, v1::JOB_STATE_PENDING,
                                     v1::JOB_STATE_STARTING, v1::JOB_STATE_PAUSED));

  CommandResult run = c().Stagectl({"run", id, "--steps", "3", "-o", "json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json r = nlohmann::json::parse(run.out);
  EXPECT_EQ(r["until_global_step"], 3);
  EXPECT_EQ(r["steps_total"], 6);
  auto held3 = WaitForState(id, v1::JOB_STATE_PAUSED, 3);
  ASSERT_TRUE(held3.ok()) << held3.status();
  ASSERT_EQ(held3->state(), v1::JOB_STATE_PAUSED) << held3->reason();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto still3 = c().GetJob(id);
  ASSERT_TRUE(still3.ok());
  EXPECT_EQ(still3->state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(still3->steps_done(), 3);
  EXPECT_EQ(still3->global_steps_done(), 3);
  EXPECT_EQ(still3->losses_size(), 3);

  // Past steps_total (6): 3 + 5 = 8, and it holds there.
  v1::RunStepsRequest more;
  more.set_job_id(id);
  more.set_steps(5);
  v1::RunStepsResponse more_resp;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    grpc::Status s = stub_->RunSteps(&ctx, more, &more_resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(more_resp.until_global_step(), 8);
  EXPECT_EQ(more_resp.job().steps_total(), 8);
  auto held8 = WaitForState(id, v1::JOB_STATE_PAUSED, 8);
  ASSERT_TRUE(held8.ok()) << held8.status();
  ASSERT_EQ(held8->state(), v1::JOB_STATE_PAUSED) << held8->reason();
  EXPECT_EQ(held8->steps_total(), 8);
  // steps < 1 is refused.
  {
    v1::RunStepsRequest zero;
    zero.set_job_id(id);
    zero.set_steps(0);
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    EXPECT_EQ(stub_->RunSteps(&ctx, zero, &more_resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }

  CommandResult resume = c().Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.err;
  auto done = c().WaitForJob(id, IsFinal, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason();
  EXPECT_EQ(done->steps_done(), 8);
  // The spec's data stream continues across holds: the losses of 8 uninterrupted steps.
  ExpectLossesMatch(*done, TrainReference(Config(8)).losses);
}

TEST_F(StepControl, StepJobRunsClientBatchesLikeTheReference) {
  const std::string id = Submit(Spec("client", 100000), true);
  ASSERT_FALSE(id.empty());
  auto held = WaitForState(id, v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason();

  const ReferenceConfig config = Config(1);
  torch::manual_seed(1234);
  const torch::Tensor x = torch::randn({8, config.sizes.front()});
  const torch::Tensor y = torch::randn({8, config.sizes.back()});
  const std::string x_path = c().dir() + "/client-x.npy";
  const std::string y_path = c().dir() + "/client-y.npy";
  WriteNpy(x_path, x);
  WriteNpy(y_path, y);
  ReferenceConfig on_batch = config;
  on_batch.batch_size = 8;
  on_batch.dataset_inputs = x;
  on_batch.dataset_targets = y;
  const ReferenceResult ref = TrainReference(on_batch);
  const size_t layers = config.sizes.size() - 1;

  // Forward-only on the initial weights: one output row per input row; the timeline stays.
  const std::string out0 = c().dir() + "/client-out0.npy";
  CommandResult fwd = c().Stagectl(
      {"step", id, "--inputs", x_path, "--forward-only", "--save-outputs", out0, "-o", "json"});
  ASSERT_EQ(fwd.exit_code, 0) << fwd.out << fwd.err;
  EXPECT_EQ(nlohmann::json::parse(fwd.out)["global_step"], 0);
  const torch::Tensor got0 = ReadNpy(out0);
  ASSERT_TRUE(got0.defined());
  ASSERT_EQ(got0.sizes(), (std::vector<int64_t>{8, config.sizes.back()}));
  const torch::Tensor want0 = ReferenceForward(config.sizes, config.model_seed, x);
  EXPECT_TRUE(torch::allclose(got0, want0, kRtol, kAtol)) << got0 << want0;
  auto after_fwd = c().GetJob(id);
  ASSERT_TRUE(after_fwd.ok());
  EXPECT_EQ(after_fwd->state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(after_fwd->global_steps_done(), 0);

  // A training step: the reference's loss on this batch from the same initial parameters.
  CommandResult train =
      c().Stagectl({"step", id, "--inputs", x_path, "--targets", y_path, "-o", "json"});
  ASSERT_EQ(train.exit_code, 0) << train.out << train.err;
  nlohmann::json t = nlohmann::json::parse(train.out);
  EXPECT_EQ(t["global_step"], 0);
  ASSERT_TRUE(t["loss"].is_number()) << train.out;
  EXPECT_NEAR(t["loss"].get<double>(), ref.losses[0], kAtol + kRtol * ref.losses[0]);
  EXPECT_EQ(t["microbatch_losses"].size(), 4u);
  auto after_train = WaitForState(id, v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(after_train.ok());
  EXPECT_EQ(after_train->state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(after_train->global_steps_done(), 1);
  EXPECT_EQ(after_train->attempt(), 1);

  // Forward-only again, on the updated weights (the reference's after its one step).
  v1::StepJobRequest fwd_req;
  fwd_req.set_job_id(id);
  fwd_req.set_forward_only(true);
  *fwd_req.mutable_inputs() = ToTensorData(x);
  v1::StepJobResponse fwd_resp;
  grpc::Status s = StepJob(fwd_req, &fwd_resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(fwd_resp.global_step(), 1);
  ASSERT_EQ(fwd_resp.outputs().dtype(), "float32");
  ASSERT_EQ(fwd_resp.outputs().shape_size(), 2);
  ASSERT_EQ(fwd_resp.outputs().shape(0), 8);
  ASSERT_EQ(fwd_resp.outputs().shape(1), config.sizes.back());
  torch::Tensor got1 = torch::empty({8, config.sizes.back()}, torch::kFloat32);
  ASSERT_EQ(fwd_resp.outputs().data().size(), got1.nbytes());
  std::memcpy(got1.data_ptr(), fwd_resp.outputs().data().data(), got1.nbytes());
  const torch::Tensor want1 = ForwardWith(ref.params, layers, x);
  EXPECT_TRUE(torch::allclose(got1, want1, kRtol, kAtol)) << got1 << want1;
  EXPECT_FALSE(torch::allclose(want0, want1, kRtol, kAtol)) << "the training step moved nothing";
  auto after_fwd2 = c().GetJob(id);
  ASSERT_TRUE(after_fwd2.ok());
  EXPECT_EQ(after_fwd2->state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(after_fwd2->global_steps_done(), 1);

  // Targets with a row count other than the inputs' name `targets`.
  v1::StepJobRequest bad = fwd_req;
  bad.set_forward_only(false);
  *bad.mutable_targets() = ToTensorData(torch::randn({7, config.sizes.back()}));
  v1::StepJobResponse bad_resp;
  s = StepJob(bad, &bad_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("targets"));
  auto after_bad = c().GetJob(id);
  ASSERT_TRUE(after_bad.ok());
  EXPECT_EQ(after_bad->state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(after_bad->global_steps_done(), 1);

  // Running (100000 steps): a client step is FAILED_PRECONDITION.
  CommandResult resume = c().Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.err;
  auto running = c().WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.global_steps_done() >= 3; },
      absl::Seconds(60));
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << running->reason();
  v1::StepJobRequest train_req = bad;
  *train_req.mutable_targets() = ToTensorData(y);
  s = StepJob(train_req, &bad_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  Cancel(id);
}

TEST_F(StepControl, CheckpointJobOnARunningJobIsComplete) {
  const std::string id = Submit(Spec("ckpt", 100000), false);
  ASSERT_FALSE(id.empty());
  auto running = c().WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.steps_done() >= 2; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::JOB_STATE_RUNNING) << running->reason();
  v1::CheckpointJobRequest req;
  req.set_job_id(id);
  v1::CheckpointJobResponse resp;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    grpc::Status s = stub_->CheckpointJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_GE(resp.step(), 2);
  auto with = c().WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.checkpoints_size() > 0; },
      absl::Seconds(60));
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_EQ(with->checkpoints_size(), 1) << with->reason();
  EXPECT_EQ(with->checkpoints(0).step(), resp.step());
  EXPECT_EQ(fs::path(with->checkpoints(0).directory()).lexically_normal(),
            fs::path(resp.directory()).lexically_normal());
  EXPECT_TRUE(fs::exists(with->checkpoints(0).manifest())) << with->checkpoints(0).manifest();
  for (int s = 0; s < 2; ++s) {
    EXPECT_TRUE(fs::exists(absl::StrCat(resp.directory(), "/stage-", s, ".pt")));
  }
  EXPECT_EQ(with->state(), v1::JOB_STATE_RUNNING);
  Cancel(id);
}

TEST_F(StepControl, CheckpointJobOnAPausedJobWritesWhereItHolds) {
  const std::string id = Submit(Spec("ckpt-paused", 6), true);
  ASSERT_FALSE(id.empty());
  CommandResult run = c().Stagectl({"run", id, "--steps", "3"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto held = WaitForState(id, v1::JOB_STATE_PAUSED, 3);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(held->state(), v1::JOB_STATE_PAUSED) << held->reason();

  CommandResult ckpt = c().Stagectl({"checkpoint", id, "-o", "json"});
  ASSERT_EQ(ckpt.exit_code, 0) << ckpt.err;
  const nlohmann::json answer = nlohmann::json::parse(ckpt.out);
  EXPECT_EQ(answer["step"], 3);
  auto with = c().WaitForJob(
      id, [](const v1::Job& j) { return IsFinal(j) || j.checkpoints_size() > 0; },
      absl::Seconds(60));
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_EQ(with->checkpoints_size(), 1) << with->reason();
  EXPECT_EQ(with->checkpoints(0).step(), 3);
  EXPECT_TRUE(fs::exists(with->checkpoints(0).manifest())) << with->checkpoints(0).manifest();
  EXPECT_EQ(with->state(), v1::JOB_STATE_PAUSED) << "the job stays where it holds";
  EXPECT_EQ(with->global_steps_done(), 3);
  // Asking again answers with the same checkpoint; nothing is written twice.
  CommandResult again = c().Stagectl({"checkpoint", id, "-o", "json"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out)["step"], 3);

  CommandResult resume = c().Stagectl({"resume", id});
  ASSERT_EQ(resume.exit_code, 0) << resume.err;
  auto done = c().WaitForJob(id, IsFinal, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason();
  // The paused checkpoint and the final one; the losses are those of 6 uninterrupted steps.
  ASSERT_EQ(done->checkpoints_size(), 2);
  EXPECT_EQ(done->checkpoints(1).step(), 6);
  ExpectLossesMatch(*done, TrainReference(Config(6)).losses);
}

// The "type", "stage" and "microbatch" of a trace event's action.
struct ActionKey {
  std::string type;
  int stage = -1;
  int microbatch = -1;
};

ActionKey KeyOf(const nlohmann::json& e) {
  ActionKey k;
  const nlohmann::json& a = e["args"];
  if (a.contains("type")) k.type = a["type"].get<std::string>();
  if (a.contains("stage")) k.stage = a["stage"].get<int>();
  if (a.contains("microbatch")) k.microbatch = a["microbatch"].get<int>();
  return k;
}

TEST_F(StepControl, ScheduleMatchesTheJobAndTheStepTraceIsCausal) {
  const std::string id = Submit(Spec("trace", 4), false);
  ASSERT_FALSE(id.empty());
  auto done = c().WaitForJob(id, IsFinal, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason();

  v1::GetJobScheduleRequest sreq;
  sreq.set_job_id(id);
  v1::GetJobScheduleResponse sched;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    grpc::Status s = stub_->GetJobSchedule(&ctx, sreq, &sched);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(sched.schedule(), "1F1B");
  EXPECT_EQ(sched.num_stages(), 2);
  EXPECT_EQ(sched.num_ranks(), 2);
  EXPECT_EQ(sched.microbatches(), 4);
  ASSERT_EQ(sched.ranks_size(), 2);
  ASSERT_EQ(done->ranks_size(), 2);
  for (int r = 0; r < 2; ++r) {
    const v1::RankSchedule& rs = sched.ranks(r);
    EXPECT_EQ(rs.rank(), r);
    EXPECT_THAT(rs.stages(), ::testing::ElementsAre(r));
    EXPECT_THAT(rs.lowered_actions(),
                ::testing::ElementsAreArray(done->ranks(r).assigned_actions()))
        << "rank " << r;
    // 4 F and 4 B per rank in the compute list, all of them in the lowered list.
    EXPECT_EQ(rs.compute_actions_size(), 8) << absl::StrJoin(rs.compute_actions(), " ");
    for (const std::string& a : rs.compute_actions()) {
      EXPECT_THAT(rs.lowered_actions(), ::testing::Contains(a)) << "rank " << r;
    }
    EXPECT_GT(rs.lowered_actions_size(), rs.compute_actions_size());
  }
  EXPECT_FALSE(sched.grid().empty());
  EXPECT_THAT(sched.grid(), HasSubstr("0F0"));
  EXPECT_THAT(sched.lowered_grid(), HasSubstr("SEND_F"));

  // The latest step's trace is step 3; step 2's is kept too.
  v1::GetStepTraceRequest treq;
  treq.set_job_id(id);
  treq.set_global_step(-1);
  v1::GetStepTraceResponse trace;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    grpc::Status s = stub_->GetStepTrace(&ctx, treq, &trace);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(trace.global_step(), 3);
  EXPECT_EQ(trace.last_kept_step(), 3);
  EXPECT_LE(trace.first_kept_step(), 2);
  {
    v1::GetStepTraceRequest unknown = treq;
    unknown.set_global_step(99);
    v1::GetStepTraceResponse none;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, absl::Seconds(30));
    EXPECT_EQ(stub_->GetStepTrace(&ctx, unknown, &none).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  nlohmann::json j = nlohmann::json::parse(trace.trace_json());
  ASSERT_TRUE(j.contains("traceEvents"));
  // Per rank: compute events by (type, stage, microbatch); SEND/RECV posts; transfers by name.
  struct Span {
    double start, end;
  };
  std::map<std::tuple<int, std::string, int, int>, Span> compute;  // (pid, type, stage, mb)
  std::map<std::pair<int, std::string>, Span> transfers;           // (pid, action name)
  std::map<std::pair<int, std::string>, double> posts;             // (pid, action name) -> ts
  std::map<int64_t, std::string> flow_start, flow_end;             // flow id -> event name
  for (const nlohmann::json& e : j["traceEvents"]) {
    const std::string ph = e.value("ph", "");
    if (ph == "M") continue;
    const int pid = e["pid"].get<int>();
    const std::string name = e["name"].get<std::string>();
    if (ph == "X") {
      const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
      EXPECT_GE(dur, 0) << e.dump();
      if (e["args"].value("event", "") == "transfer") {
        transfers[{pid, name}] = {ts, ts + dur};
      } else {
        const ActionKey k = KeyOf(e);
        compute[{pid, k.type, k.stage, k.microbatch}] = {ts, ts + dur};
      }
    } else if (ph == "i") {
      posts[{pid, name}] = e["ts"].get<double>();
    } else if (ph == "s") {
      flow_start[e["id"].get<int64_t>()] = name;
    } else if (ph == "f") {
      flow_end[e["id"].get<int64_t>()] = name;
    }
  }
  // 1F1B on 2 ranks, 4 microbatches: 4 SEND_F on rank 0, 4 SEND_B on rank 1, and their RECVs.
  int sends = 0;
  for (const auto& [key, ts] : posts) {
    const auto& [pid, name] = key;
    if (name.find("SEND_") == std::string::npos) continue;
    ++sends;
    const bool forward = name.find("SEND_F") != std::string::npos;
    const int stage = pid;  // stage s on rank s
    const int mb = std::stoi(name.substr(name.rfind('_') + 2));
    const int peer = forward ? 1 : 0;
    const std::string recv = absl::StrCat(peer, forward ? "RECV_F" : "RECV_B", mb);
    SCOPED_TRACE(absl::StrCat(name, " -> ", recv));
    ASSERT_EQ(transfers.count({pid, name}), 1u);
    ASSERT_EQ(transfers.count({peer, recv}), 1u);
    ASSERT_EQ(posts.count({peer, recv}), 1u);
    const Span sent = transfers[{pid, name}];
    const Span received = transfers[{peer, recv}];
    // One transfer, seen from both ends: it starts at the SEND and arrives after it starts.
    EXPECT_DOUBLE_EQ(sent.start, received.start);
    EXPECT_DOUBLE_EQ(sent.end, received.end);
    EXPECT_DOUBLE_EQ(sent.start, ts);
    EXPECT_GE(sent.end, sent.start);
    // The SEND ends (its transfer arrives) no earlier than the RECV was posted, and no later
    // than the receiving compute action that consumes the data ends.
    const double recv_posted = posts[{peer, recv}];
    EXPECT_GE(received.end, recv_posted);
    // Producer F/B on the sender ends before the SEND starts.
    const auto producer = compute.find({pid, forward ? "F" : "B", stage, mb});
    ASSERT_NE(producer, compute.end());
    EXPECT_LE(producer->second.end, ts);
    const auto consumer = compute.find({peer, forward ? "F" : "B", peer, mb});
    ASSERT_NE(consumer, compute.end());
    EXPECT_GE(consumer->second.end, sent.end);
    EXPECT_GE(consumer->second.end, sent.start);
  }
  EXPECT_EQ(sends, 8);
  // Every flow links a SEND to its RECV.
  EXPECT_EQ(flow_start.size(), 8u);
  for (const auto& [fid, name] : flow_start) {
    ASSERT_EQ(flow_end.count(fid), 1u) << name;
    EXPECT_EQ(flow_end[fid], name);
    EXPECT_THAT(name, ::testing::MatchesRegex("[01]SEND_[FB][0-3] -> [01]RECV_[FB][0-3]"));
  }

  // stagectl writes the same trace.
  const std::string out = c().dir() + "/trace.json";
  CommandResult r = c().Stagectl({"trace", id, "--step", "3", "--out", out, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["global_step"], 3);
  std::ifstream in(out, std::ios::binary);
  std::stringstream written;
  written << in.rdbuf();
  EXPECT_EQ(written.str(), trace.trace_json());
  if (HasFailure()) std::cerr << trace.trace_json() << "\n";
}

TEST_F(StepControl, WatchJsonStreamsStepsEndingSucceeded) {
  const std::string spec = c().WriteFile("watch.yaml", Spec("watch", 30));
  CommandResult submit = c().Stagectl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = LastLine(submit.out);
  CommandResult watch = c().Stagectl({"watch", id, "-o", "json"});
  ASSERT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  auto job = c().GetJob(id);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason();
  std::vector<std::string> lines = absl::StrSplit(watch.out, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  std::vector<double> losses;
  int64_t last_sequence = -1;
  for (const std::string& line : lines) {
    nlohmann::json e = nlohmann::json::parse(line);
    EXPECT_EQ(e["job_id"], id);
    EXPECT_GT(e["sequence"].get<int64_t>(), last_sequence);
    last_sequence = e["sequence"].get<int64_t>();
    if (e["event"] == "step_completed") {
      EXPECT_EQ(e["step"], static_cast<int64_t>(losses.size()));
      EXPECT_EQ(e["steps_total"], 30);
      ASSERT_TRUE(e["loss"].is_number()) << line;
      EXPECT_GT(e["samples_per_second"].get<double>(), 0) << line;
      losses.push_back(e["loss"].get<double>());
    }
  }
  nlohmann::json last = nlohmann::json::parse(lines.back());
  EXPECT_EQ(last["event"], "state_change");
  EXPECT_EQ(last["state"], "SUCCEEDED");
  ASSERT_EQ(losses.size(), 30u);
  for (int i = 0; i < 30; ++i) EXPECT_DOUBLE_EQ(losses[i], job->losses(i)) << "step " << i;
}

}  // namespace
}  // namespace stagecoach::testing::step_control_test
