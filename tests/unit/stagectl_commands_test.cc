// stagectl's client side of step control, traces, job schedules and the live watch view: the
// pure rendering functions (progress line, ETA, state lines, event JSON, job tables), argument
// validation, and each command against a fake CoordinatorService on a loopback gRPC server (the
// commands' requests as the coordinator receives them, their output in every format, exit codes).
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/npy.h"
#include "client/render.h"
#include "client/watch.h"
#include "common/rpc/time_conversion.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stagecoach::client {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

v1::JobEvent StateEvent(int64_t sequence, v1::JobState state, const std::string& reason,
                        absl::Time time = absl::FromUnixSeconds(1'700'000'000)) {
  v1::JobEvent e;
  e.set_job_id("job-1");
  e.set_sequence(sequence);
  *e.mutable_time() = rpc::ToProtoTimestamp(time);
  v1::JobTransition* t = e.mutable_state_change();
  t->set_state(state);
  t->set_reason(reason);
  *t->mutable_time() = rpc::ToProtoTimestamp(time);
  return e;
}

v1::JobEvent StepEvent(int64_t sequence, int64_t step, int64_t total, double loss,
                       absl::Duration step_time, std::vector<double> bubbles = {0.25, 0.5}) {
  v1::JobEvent e;
  e.set_job_id("job-1");
  e.set_sequence(sequence);
  *e.mutable_time() = rpc::ToProtoTimestamp(absl::FromUnixSeconds(1'700'000'100));
  v1::StepCompleted* s = e.mutable_step_completed();
  s->set_step(step);
  s->set_global_step(step);
  s->set_steps_total(total);
  s->set_loss(loss);
  *s->mutable_step_time() = rpc::ToProtoDuration(step_time);
  s->set_samples_per_second(800);
  for (double b : bubbles) s->add_bubble_ratios(b);
  return e;
}

// --- Pure rendering ---

TEST(FormatEtaTest, RoundsToSecondsMinutesAndHours) {
  EXPECT_EQ(FormatEta(absl::Seconds(0)), "0s");
  EXPECT_EQ(FormatEta(absl::Milliseconds(41'600)), "42s");
  EXPECT_EQ(FormatEta(absl::Seconds(187)), "3m07s");
  EXPECT_EQ(FormatEta(absl::Minutes(125) + absl::Seconds(10)), "2h05m");
  EXPECT_EQ(FormatEta(absl::Seconds(-1)), "?");
  EXPECT_EQ(FormatEta(absl::Hours(2000)), "?");
}

TEST(WatchStateTest, EtaIsTheMeanOfRecentStepTimesTimesStepsLeft) {
  WatchState state;
  EXPECT_FALSE(EstimateRemaining(state).has_value());
  ApplyEvent(StateEvent(0, v1::JOB_STATE_RUNNING, ""), &state);
  // 12 steps: the first two (10 s each) fall out of the 10-step window; the rest take 1 s and 3 s
  // alternately (mean 2 s).
  for (int i = 0; i < 12; ++i) {
    const absl::Duration t = i < 2 ? absl::Seconds(10) : absl::Seconds(i % 2 == 0 ? 1 : 3);
    ApplyEvent(StepEvent(i + 1, i, 40, 0.5, t), &state);
  }
  EXPECT_EQ(state.steps_done, 12);
  EXPECT_EQ(state.recent_step_times.size(), WatchState::kRecentSteps);
  ASSERT_TRUE(EstimateRemaining(state).has_value());
  EXPECT_EQ(*EstimateRemaining(state), absl::Seconds(2 * 28));

  // No estimate while the job does not run.
  ApplyEvent(StateEvent(13, v1::JOB_STATE_PAUSED, "paused after step 12"), &state);
  EXPECT_EQ(state.state, v1::JOB_STATE_PAUSED);
  EXPECT_FALSE(EstimateRemaining(state).has_value());
}

TEST(WatchStateTest, StepLineShowsProgressLossThroughputBubbleAndEta) {
  WatchState state;
  EXPECT_EQ(StepLine(state), "");
  ApplyEvent(StateEvent(0, v1::JOB_STATE_RUNNING, ""), &state);
  ApplyEvent(StepEvent(1, 11, 40, 0.1234567, absl::Milliseconds(42)), &state);
  EXPECT_EQ(StepLine(state),
            "step 12/40  loss 0.123457  800 samples/s  0.042s/step  bubble 0.50  ETA 1s");

  v1::JobEvent forward = StepEvent(2, 12, 40, 0, absl::Seconds(1));
  forward.mutable_step_completed()->clear_loss();
  forward.mutable_step_completed()->set_global_step(52);
  forward.mutable_step_completed()->set_client_batch(true);
  ApplyEvent(forward, &state);
  EXPECT_THAT(StepLine(state), AllOf(StartsWith("step 13/40  loss -  "), HasSubstr("  global 52"),
                                     HasSubstr("(client batch)")));
}

TEST(WatchStateTest, StepLineAndJsonShowTheTrainingRecipe) {
  WatchState state;
  ApplyEvent(StateEvent(0, v1::JOB_STATE_RUNNING, ""), &state);
  v1::JobEvent clipped = StepEvent(1, 4, 40, 0.5, absl::Seconds(1));
  clipped.mutable_step_completed()->set_learning_rate(3e-4);
  clipped.mutable_step_completed()->set_grad_norm(1.25);
  clipped.mutable_step_completed()->set_eval_loss(0.4321);
  ApplyEvent(clipped, &state);
  EXPECT_THAT(StepLine(state), HasSubstr("ETA 35s  lr 0.0003  gnorm 1.25  eval 0.4321"));
  const nlohmann::json json = EventJson(clipped);
  EXPECT_DOUBLE_EQ(json["learning_rate"].get<double>(), 3e-4);
  EXPECT_DOUBLE_EQ(json["grad_norm"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(json["eval_loss"].get<double>(), 0.4321);
  EXPECT_EQ(json["skipped"], false);

  v1::JobEvent skipped = StepEvent(2, 5, 40, 0, absl::Seconds(1));
  skipped.mutable_step_completed()->clear_loss();
  skipped.mutable_step_completed()->set_learning_rate(3e-4);
  skipped.mutable_step_completed()->set_skipped(true);
  skipped.mutable_step_completed()->add_nonfinite_ranks(0);
  skipped.mutable_step_completed()->add_nonfinite_ranks(2);
  ApplyEvent(skipped, &state);
  // The latest eval loss stays until the next pass.
  EXPECT_THAT(StepLine(state), AllOf(StartsWith("step 6/40  loss -  "),
                                     HasSubstr("  SKIPPED (non-finite on rank 0,2)  eval 0.4321")));
  EXPECT_EQ(state.skipped_seen, 1);
  const nlohmann::json skipped_json = EventJson(skipped);
  EXPECT_TRUE(skipped_json["loss"].is_null());
  EXPECT_TRUE(skipped_json["grad_norm"].is_null());
  EXPECT_EQ(skipped_json["nonfinite_ranks"], nlohmann::json::array({0, 2}));
}

TEST(WatchStateTest, ProgressLineFitsTheTerminalAndShowsABar) {
  WatchState state;
  state.job_id = "job-1";
  EXPECT_EQ(ProgressLine(state, 80), "job-1 UNSPECIFIED");
  ApplyEvent(StateEvent(0, v1::JOB_STATE_RUNNING, ""), &state);
  ApplyEvent(StepEvent(1, 9, 40, 0.5, absl::Seconds(1)), &state);

  const std::string wide = ProgressLine(state, 200);
  // 10 of 40 steps: a quarter of the (at most 40-cell) bar is filled.
  EXPECT_THAT(wide, StartsWith(absl::StrCat("[", std::string(10, '#'), std::string(30, '.'),
                                            "] step 10/40  loss 0.500000")));
  EXPECT_THAT(wide, HasSubstr("ETA 30s"));

  for (int width : {120, 100, 80, 60, 30, 5, 1}) {
    const std::string line = ProgressLine(state, width);
    EXPECT_LE(line.size(), static_cast<size_t>(std::max(width - 1, 1))) << width;
    EXPECT_FALSE(line.empty()) << width;
  }
  // An 80-column terminal: the compact text, with a bar.
  EXPECT_THAT(ProgressLine(state, 80),
              AllOf(StartsWith("["), HasSubstr("] 10/40 loss 0.5000 800/s 1.000s/step bubble 0.50 "
                                               "ETA 30s")));
  // Too narrow for a bar: the compact text alone, cut.
  EXPECT_THAT(ProgressLine(state, 40), StartsWith("10/40 loss 0.5000"));

  ApplyEvent(StateEvent(2, v1::JOB_STATE_PAUSED, "paused after step 10"), &state);
  EXPECT_THAT(ProgressLine(state, 200), AllOf(HasSubstr("ETA -"), HasSubstr("PAUSED")));
}

TEST(WatchStateTest, StateLineHasTimeStateAndReason) {
  const absl::TimeZone utc = absl::UTCTimeZone();
  const absl::Time t = absl::FromCivil(absl::CivilSecond(2026, 11, 21, 12, 3, 4), utc);
  EXPECT_EQ(
      StateLine(StateEvent(0, v1::JOB_STATE_PAUSED, "paused after step 40", t).state_change(), utc),
      "12:03:04 PAUSED  paused after step 40");
  EXPECT_EQ(StateLine(StateEvent(0, v1::JOB_STATE_RESTARTING, "", t).state_change(), utc),
            "12:03:04 RESTARTING");
}

TEST(WatchStateTest, EventJsonNamesTheEventAndItsFields) {
  const nlohmann::json state =
      EventJson(StateEvent(3, v1::JOB_STATE_PLANNING, "inspecting the model"));
  EXPECT_EQ(state["event"], "state_change");
  EXPECT_EQ(state["state"], "PLANNING");
  EXPECT_EQ(state["sequence"], 3);
  EXPECT_EQ(state["reason"], "inspecting the model");

  v1::JobEvent step_event = StepEvent(4, 2, 6, 0.25, absl::Milliseconds(1500), {0.1, 0.4});
  const nlohmann::json step = EventJson(step_event);
  EXPECT_EQ(step["event"], "step_completed");
  EXPECT_EQ(step["step"], 2);
  EXPECT_EQ(step["steps_total"], 6);
  EXPECT_DOUBLE_EQ(step["loss"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(step["step_time_seconds"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(step["max_bubble_ratio"].get<double>(), 0.4);
  EXPECT_EQ(step["client_batch"], false);
  step_event.mutable_step_completed()->clear_loss();
  EXPECT_TRUE(EventJson(step_event)["loss"].is_null());
}

v1::Job RestartedPausedJob() {
  v1::Job job;
  job.set_id("job-7");
  job.set_name("mlp");
  job.set_state(v1::JOB_STATE_PAUSED);
  job.set_steps_done(30);
  job.set_steps_total(50);
  job.set_global_steps_done(40);
  job.set_pause_at_global_step(40);
  job.set_attempt(2);
  job.set_restarts(1);
  job.set_max_restarts(3);
  v1::JobFailure* failure = job.mutable_failure();
  failure->set_rank(1);
  failure->set_worker_id("w-2");
  failure->set_action("1RECV_F3");
  failure->set_error("lost: missed heartbeats for 3s");
  return job;
}

TEST(RenderJobTest, ShowsTheTrainingRecipe) {
  v1::Job job = RestartedPausedJob();
  job.add_losses(0.5);
  job.add_losses(std::nan(""));
  job.set_learning_rate(2.5e-4);
  job.set_grad_norm(0.75);
  for (int64_t step : {12, 39}) job.add_skipped_steps(step);
  job.set_consecutive_skipped_steps(1);
  v1::EvalResult* eval = job.add_evals();
  eval->set_global_step(29);
  eval->set_loss(0.3);
  const std::string details = JobDetails(job);
  EXPECT_THAT(details, HasSubstr("Loss:      0.500000 (first) -> skipped (latest)"));
  EXPECT_THAT(details, HasSubstr("LR:        0.00025 (latest step); grad norm 0.75"));
  EXPECT_THAT(details, HasSubstr("Skipped:   2 steps (non-finite gradients), global steps 12, 39; "
                                 "1 in a row now"));
  EXPECT_THAT(details, HasSubstr("Eval loss: 0.300000 after global step 30 (1 passes)"));
  const nlohmann::json json = JobJson(job);
  EXPECT_TRUE(json["losses"][1].is_null());
  EXPECT_EQ(json["skipped_steps"], nlohmann::json::array({12, 39}));
  EXPECT_DOUBLE_EQ(json["evals"][0]["loss"].get<double>(), 0.3);
}

TEST(RenderJobTest, ShowsRestartsFailureGlobalStepAndPause) {
  const v1::Job job = RestartedPausedJob();
  const std::string details = JobDetails(job);
  EXPECT_THAT(details, HasSubstr("State:     PAUSED"));
  EXPECT_THAT(details, HasSubstr("Steps:     30/50 (global step 40)"));
  EXPECT_THAT(details, HasSubstr("holding at global step 40"));
  EXPECT_THAT(details, HasSubstr("Attempt:   2 (restarts 1/3)"));
  EXPECT_THAT(details,
              HasSubstr("Failure:   rank 1 on w-2 at 1RECV_F3: lost: missed heartbeats for 3s"));

  const nlohmann::json json = JobJson(job);
  EXPECT_EQ(json["state"], "PAUSED");
  EXPECT_EQ(json["global_steps_done"], 40);
  EXPECT_EQ(json["pause_at_global_step"], 40);
  EXPECT_EQ(json["attempt"], 2);
  EXPECT_EQ(json["restarts"], 1);
  EXPECT_EQ(json["max_restarts"], 3);
  EXPECT_EQ(json["failure"]["rank"], 1);
  EXPECT_EQ(json["failure"]["worker_id"], "w-2");
  EXPECT_EQ(json["failure"]["action"], "1RECV_F3");
  EXPECT_EQ(json["failure"]["error"], "lost: missed heartbeats for 3s");

  const std::string table = JobsTable({job});
  EXPECT_THAT(table, AllOf(HasSubstr("GLOBAL"), HasSubstr("RESTARTS"), HasSubstr("PAUSED@40"),
                           HasSubstr("1/3")));
  v1::Job clean;
  clean.set_state(v1::JOB_STATE_STARTING);
  EXPECT_FALSE(JobJson(clean).contains("failure"));
  EXPECT_THAT(JobDetails(clean), Not(HasSubstr("Failure:")));
  EXPECT_EQ(StateName(v1::JOB_STATE_RESTARTING), "RESTARTING");
}

// --- Argument validation ---

TEST(StepOptionsTest, ErrorsNameTheFlag) {
  StepOptions o;
  o.inputs = "x.npy";
  EXPECT_THAT(std::string(ValidateStepOptions(o).status().message()), StartsWith("--targets:"));
  o.targets = "y.npy";
  ASSERT_TRUE(ValidateStepOptions(o).ok());
  EXPECT_EQ(*ValidateStepOptions(o), absl::Minutes(5));
  o.save_outputs = "out.npy";
  EXPECT_THAT(std::string(ValidateStepOptions(o).status().message()),
              StartsWith("--save-outputs:"));
  o.forward_only = true;
  EXPECT_THAT(std::string(ValidateStepOptions(o).status().message()), StartsWith("--targets:"));
  o.targets.clear();
  EXPECT_TRUE(ValidateStepOptions(o).ok());
  o.timeout = "soon";
  EXPECT_THAT(std::string(ValidateStepOptions(o).status().message()), StartsWith("--timeout:"));
  o.timeout = "0s";
  EXPECT_FALSE(ValidateStepOptions(o).ok());
  o = StepOptions{};
  o.forward_only = true;
  EXPECT_THAT(std::string(ValidateStepOptions(o).status().message()), StartsWith("--inputs:"));
}

// --- Commands against a fake coordinator ---

// CoordinatorService with canned answers; records the requests it gets.
class FakeCoordinator final : public v1::CoordinatorService::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    absl::MutexLock lock(&mu_);
    submitted_ = *req;
    resp->set_job_id("job-1");
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*,
                      v1::GetJobResponse* resp) override {
    *resp->mutable_job() = RestartedPausedJob();
    return grpc::Status::OK;
  }
  grpc::Status PauseJob(grpc::ServerContext*, const v1::PauseJobRequest* req,
                        v1::PauseJobResponse* resp) override {
    if (req->job_id() != "job-1") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job");
    resp->set_global_step(40);
    resp->mutable_job()->set_state(v1::JOB_STATE_RUNNING);
    return grpc::Status::OK;
  }
  grpc::Status RunSteps(grpc::ServerContext*, const v1::RunStepsRequest* req,
                        v1::RunStepsResponse* resp) override {
    resp->set_until_global_step(40 + req->steps());
    resp->mutable_job()->set_state(v1::JOB_STATE_RUNNING);
    resp->mutable_job()->set_steps_total(40 + req->steps());
    return grpc::Status::OK;
  }
  grpc::Status StepJob(grpc::ServerContext*, const v1::StepJobRequest* req,
                       v1::StepJobResponse* resp) override {
    absl::MutexLock lock(&mu_);
    stepped_ = *req;
    resp->set_global_step(41);
    *resp->mutable_step_time() = rpc::ToProtoDuration(absl::Milliseconds(50));
    if (req->forward_only()) {
      // Outputs: the inputs doubled (float32), so the test can check the written file.
      v1::TensorData* out = resp->mutable_outputs();
      *out = req->inputs();
      std::string data = out->data();
      for (size_t i = 0; i + 4 <= data.size(); i += 4) {
        float v;
        std::memcpy(&v, data.data() + i, 4);
        v *= 2;
        std::memcpy(data.data() + i, &v, 4);
      }
      out->set_data(data);
    } else {
      resp->add_microbatch_losses(0.5);
      resp->add_microbatch_losses(0.25);
      resp->set_loss(0.375);
    }
    return grpc::Status::OK;
  }
  grpc::Status GetJobSchedule(grpc::ServerContext*, const v1::GetJobScheduleRequest*,
                              v1::GetJobScheduleResponse* resp) override {
    resp->set_schedule("1F1B");
    resp->set_num_stages(2);
    resp->set_num_ranks(2);
    resp->set_microbatches(2);
    for (int r = 0; r < 2; ++r) {
      v1::RankSchedule* rank = resp->add_ranks();
      rank->set_rank(r);
      rank->add_stages(r);
      rank->add_compute_actions(absl::StrCat(r, "F0"));
      rank->add_lowered_actions(absl::StrCat(r, "F0"));
    }
    resp->set_grid("COMPUTE GRID");
    resp->set_lowered_grid("LOWERED GRID\n");
    return grpc::Status::OK;
  }
  grpc::Status GetStepTrace(grpc::ServerContext*, const v1::GetStepTraceRequest* req,
                            v1::GetStepTraceResponse* resp) override {
    if (req->global_step() > 9) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "step 12 is not kept; kept: 5..9");
    }
    resp->set_global_step(req->global_step() < 0 ? 9 : req->global_step());
    resp->set_trace_json(R"({"traceEvents": []})");
    resp->set_first_kept_step(5);
    resp->set_last_kept_step(9);
    return grpc::Status::OK;
  }
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    std::vector<v1::JobEvent> events;
    {
      absl::MutexLock lock(&mu_);
      events = events_;
    }
    for (const auto& e : events) {
      if (e.sequence() >= req->from_sequence()) writer->Write(e);
    }
    return grpc::Status::OK;
  }

  void SetEvents(std::vector<v1::JobEvent> events) {
    absl::MutexLock lock(&mu_);
    events_ = std::move(events);
  }
  v1::SubmitJobRequest submitted() {
    absl::MutexLock lock(&mu_);
    return submitted_;
  }
  v1::StepJobRequest stepped() {
    absl::MutexLock lock(&mu_);
    return stepped_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  v1::SubmitJobRequest submitted_ ABSL_GUARDED_BY(mu_);
  v1::StepJobRequest stepped_ ABSL_GUARDED_BY(mu_);
};

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("stagectl_commands_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    std::filesystem::remove_all(dir_);
  }

  // Runs `command` with a fresh Commands in `format`; returns its exit code.
  template <typename F>
  int Run(OutputFormat format, F command) {
    out_.str("");
    err_.str("");
    ClientOptions options;
    options.coordinator = address_;
    options.format = format;
    Commands commands(options, out_, err_);
    return command(commands);
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A float32 [rows, 2] .npy file of 0, 1, 2, ...
  std::string WriteFloats(const std::string& name, int rows) {
    v1::TensorData t;
    t.set_dtype("float32");
    t.add_shape(rows);
    t.add_shape(2);
    std::string data(rows * 2 * 4, '\0');
    for (int i = 0; i < rows * 2; ++i) {
      const float v = static_cast<float>(i);
      std::memcpy(data.data() + 4 * i, &v, 4);
    }
    t.set_data(data);
    EXPECT_TRUE(WriteNpy(Path(name), t).ok());
    return Path(name);
  }

  FakeCoordinator fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::filesystem::path dir_;
  std::ostringstream out_, err_;
};

TEST_F(CommandsTest, PausePrintsTheHoldStepInEveryFormat) {
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.Pause("job-1"); }), 0);
  EXPECT_EQ(out_.str(), "job-1 pausing: will hold at global step 40\n");
  EXPECT_EQ(Run(OutputFormat::kJson, [](Commands& c) { return c.Pause("job-1"); }), 0);
  const nlohmann::json json = nlohmann::json::parse(out_.str());
  EXPECT_EQ(json["global_step"], 40);
  EXPECT_EQ(json["state"], "RUNNING");
  EXPECT_EQ(Run(OutputFormat::kYaml, [](Commands& c) { return c.Pause("job-1"); }), 0);
  EXPECT_THAT(out_.str(), HasSubstr("global_step: 40"));
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.Pause("job-9"); }), 1);
  EXPECT_THAT(err_.str(), HasSubstr("pause job-9: no job"));
}

TEST_F(CommandsTest, UnimplementedCallsSayTheCoordinatorIsOlder) {
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.Resume("job-1"); }), 1);
  EXPECT_THAT(err_.str(), HasSubstr("resume job-1: the coordinator at " + address_ +
                                    " does not implement this call"));
}

TEST_F(CommandsTest, RunPrintsTheStepItRunsUntilAndRefusesZeroSteps) {
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.RunSteps("job-1", 5); }), 0);
  EXPECT_EQ(out_.str(), "job-1 runs until global step 45\n");
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.RunSteps("job-1", 0); }), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--steps: must be >= 1"));
}

TEST_F(CommandsTest, SubmitPausedSetsStartPaused) {
  std::ofstream(Path("job.yaml")) << "name: x\n";
  EXPECT_EQ(Run(OutputFormat::kTable,
                [&](Commands& c) { return c.Submit(Path("job.yaml"), false, {}, true); }),
            0);
  EXPECT_TRUE(fake_.submitted().start_paused());
  EXPECT_EQ(Run(OutputFormat::kTable,
                [&](Commands& c) { return c.Submit(Path("job.yaml"), false, {}, false); }),
            0);
  EXPECT_FALSE(fake_.submitted().start_paused());
}

TEST_F(CommandsTest, TrainingStepSendsBothTensorsAndPrintsTheLoss) {
  StepOptions o;
  o.inputs = WriteFloats("x.npy", 4);
  o.targets = WriteFloats("y.npy", 4);
  o.timeout = "30s";
  EXPECT_EQ(Run(OutputFormat::kTable, [&](Commands& c) { return c.Step("job-1", o); }), 0)
      << err_.str();
  EXPECT_EQ(out_.str(), "job-1 step 41: loss 0.375000 (0.050s)\n");
  const v1::StepJobRequest req = fake_.stepped();
  EXPECT_FALSE(req.forward_only());
  EXPECT_THAT(req.inputs().shape(), ElementsAre(4, 2));
  EXPECT_THAT(req.targets().shape(), ElementsAre(4, 2));
  EXPECT_EQ(rpc::FromProtoDuration(req.timeout()), absl::Seconds(30));

  EXPECT_EQ(Run(OutputFormat::kJson, [&](Commands& c) { return c.Step("job-1", o); }), 0);
  const nlohmann::json json = nlohmann::json::parse(out_.str());
  EXPECT_EQ(json["global_step"], 41);
  EXPECT_DOUBLE_EQ(json["loss"].get<double>(), 0.375);
  EXPECT_EQ(json["microbatch_losses"], nlohmann::json({0.5, 0.25}));
}

TEST_F(CommandsTest, StepUsageErrorsComeBeforeAnyCall) {
  StepOptions o;
  o.inputs = WriteFloats("x.npy", 4);
  EXPECT_EQ(Run(OutputFormat::kTable, [&](Commands& c) { return c.Step("job-1", o); }), 2);
  EXPECT_THAT(err_.str(), HasSubstr("stagectl: step: --targets: required"));
  o.targets = Path("missing.npy");
  EXPECT_EQ(Run(OutputFormat::kTable, [&](Commands& c) { return c.Step("job-1", o); }), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--targets: " + Path("missing.npy")));
  EXPECT_FALSE(fake_.stepped().has_inputs());
}

TEST_F(CommandsTest, ForwardOnlyStepWritesTheOutputs) {
  StepOptions o;
  o.inputs = WriteFloats("x.npy", 3);
  o.forward_only = true;
  o.save_outputs = Path("out.npy");
  EXPECT_EQ(Run(OutputFormat::kTable, [&](Commands& c) { return c.Step("job-1", o); }), 0)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("written to " + Path("out.npy")));
  EXPECT_TRUE(fake_.stepped().forward_only());
  EXPECT_FALSE(fake_.stepped().has_targets());
  absl::StatusOr<v1::TensorData> outputs = ReadNpy(Path("out.npy"));
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_THAT(outputs->shape(), ElementsAre(3, 2));
  float last;
  std::memcpy(&last, outputs->data().data() + 4 * 5, 4);
  EXPECT_EQ(last, 10.0f);

  o.save_outputs.clear();
  EXPECT_EQ(Run(OutputFormat::kJson, [&](Commands& c) { return c.Step("job-1", o); }), 0);
  const nlohmann::json json = nlohmann::json::parse(out_.str());
  EXPECT_EQ(json["values"], nlohmann::json({{0.0, 2.0}, {4.0, 6.0}, {8.0, 10.0}}));
  EXPECT_EQ(json["global_step"], 41);
}

TEST_F(CommandsTest, JobScheduleShowsTheGridOrTheResponse) {
  EXPECT_EQ(
      Run(OutputFormat::kTable, [](Commands& c) { return c.JobSchedule("job-1", false, ""); }), 0);
  EXPECT_EQ(out_.str(), "COMPUTE GRID\n");
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.JobSchedule("job-1", true, ""); }),
            0);
  EXPECT_EQ(out_.str(), "LOWERED GRID\n");
  EXPECT_EQ(Run(OutputFormat::kJson, [](Commands& c) { return c.JobSchedule("job-1", false, ""); }),
            0);
  const nlohmann::json json = nlohmann::json::parse(out_.str());
  EXPECT_EQ(json["schedule"], "1F1B");
  EXPECT_EQ(json["ranks"][1]["compute_actions"], nlohmann::json({"1F0"}));
  EXPECT_EQ(Run(OutputFormat::kYaml,
                [&](Commands& c) { return c.JobSchedule("job-1", false, Path("s.yaml")); }),
            0);
  std::stringstream file;
  file << std::ifstream(Path("s.yaml")).rdbuf();
  EXPECT_THAT(file.str(), HasSubstr("num_ranks: 2"));
}

TEST_F(CommandsTest, TraceWritesTheFileAndSaysWhichStep) {
  EXPECT_EQ(
      Run(OutputFormat::kTable, [&](Commands& c) { return c.Trace("job-1", -1, Path("t.json")); }),
      0)
      << err_.str();
  EXPECT_THAT(out_.str(), AllOf(HasSubstr("job-1 step 9: trace written to " + Path("t.json")),
                                HasSubstr("steps 5..9 kept")));
  std::stringstream file;
  file << std::ifstream(Path("t.json")).rdbuf();
  EXPECT_EQ(file.str(), R"({"traceEvents": []})");
  EXPECT_EQ(
      Run(OutputFormat::kJson, [&](Commands& c) { return c.Trace("job-1", 7, Path("t.json")); }),
      0);
  EXPECT_EQ(nlohmann::json::parse(out_.str())["global_step"], 7);
  EXPECT_EQ(
      Run(OutputFormat::kTable, [&](Commands& c) { return c.Trace("job-1", 12, Path("t.json")); }),
      1);
  EXPECT_THAT(err_.str(), HasSubstr("kept: 5..9"));
}

TEST_F(CommandsTest, StatusShowsTheNewJobFields) {
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.Status("job-7"); }), 0);
  EXPECT_THAT(out_.str(), HasSubstr("Attempt:   2 (restarts 1/3)"));
  EXPECT_EQ(Run(OutputFormat::kYaml, [](Commands& c) { return c.Status("job-7"); }), 0);
  EXPECT_THAT(out_.str(), AllOf(HasSubstr("state: PAUSED"), HasSubstr("pause_at_global_step: 40")));
}

std::vector<v1::JobEvent> PausedThenSucceeded() {
  return {StateEvent(0, v1::JOB_STATE_RUNNING, ""),
          StepEvent(1, 0, 2, 0.5, absl::Milliseconds(100)),
          StateEvent(2, v1::JOB_STATE_PAUSED, "paused after step 1"),
          StateEvent(3, v1::JOB_STATE_RUNNING, "resumed"),
          StepEvent(4, 1, 2, 0.25, absl::Milliseconds(100)),
          StateEvent(5, v1::JOB_STATE_SUCCEEDED, "")};
}

TEST_F(CommandsTest, WatchPrintsOnePlainLinePerEventAndExitsZeroOnSuccess) {
  fake_.SetEvents(PausedThenSucceeded());
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.Watch("job-1"); }), 0)
      << err_.str();
  const std::vector<std::string> lines = absl::StrSplit(out_.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << out_.str();
  EXPECT_THAT(lines[0], HasSubstr(" RUNNING"));
  EXPECT_THAT(lines[1], StartsWith("step 1/2  loss 0.500000  "));
  EXPECT_THAT(lines[2], HasSubstr(" PAUSED  paused after step 1"));
  EXPECT_THAT(lines[4], StartsWith("step 2/2  loss 0.250000  "));
  EXPECT_THAT(lines[5], HasSubstr(" SUCCEEDED"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("\r")));
}

TEST_F(CommandsTest, WatchJsonLinesAndYamlDocuments) {
  fake_.SetEvents(PausedThenSucceeded());
  EXPECT_EQ(Run(OutputFormat::kJson, [](Commands& c) { return c.Watch("job-1"); }), 0);
  const std::vector<std::string> lines = absl::StrSplit(out_.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u);
  for (const auto& line : lines) EXPECT_NO_THROW(nlohmann::json::parse(line)) << line;
  EXPECT_EQ(nlohmann::json::parse(lines[2])["state"], "PAUSED");
  EXPECT_EQ(nlohmann::json::parse(lines[4])["event"], "step_completed");

  EXPECT_EQ(Run(OutputFormat::kYaml, [](Commands& c) { return c.Watch("job-1"); }), 0);
  const std::vector<std::string> docs = absl::StrSplit(out_.str(), "---\n", absl::SkipEmpty());
  EXPECT_EQ(docs.size(), 6u);
  EXPECT_THAT(docs[5], HasSubstr("state: SUCCEEDED"));
}

TEST_F(CommandsTest, WatchExitsOneWhenTheJobFailsOrTheStreamEndsEarly) {
  fake_.SetEvents({StateEvent(0, v1::JOB_STATE_RUNNING, ""),
                   StateEvent(1, v1::JOB_STATE_RESTARTING, "rank 1 lost"),
                   StateEvent(2, v1::JOB_STATE_FAILED, "rank 1 lost; no restarts left")});
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.Watch("job-1"); }), 1);
  EXPECT_THAT(out_.str(), HasSubstr("RESTARTING  rank 1 lost"));
  EXPECT_THAT(err_.str(), HasSubstr("job-1 FAILED: rank 1 lost; no restarts left"));

  fake_.SetEvents({StateEvent(0, v1::JOB_STATE_RUNNING, "")});
  EXPECT_EQ(Run(OutputFormat::kTable, [](Commands& c) { return c.Watch("job-1"); }), 1);
  EXPECT_THAT(err_.str(), HasSubstr("the event stream ended before the job did"));
}

}  // namespace
}  // namespace stagecoach::client
