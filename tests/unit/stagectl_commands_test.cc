// stagectl's client side of step control, traces, job schedules and the live watch view: argument
// validation, and each command against a fake CoordinatorService on a loopback gRPC server (the
// commands' requests as the coordinator receives them, their output in every format, exit codes).
// The pure rendering functions are stagectl_render_test's.
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
#include "client/render/render.h"
#include "client/render/watch.h"
#include "common/rpc/time_conversion.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/stagectl_test_events.h"

namespace stagecoach::client::stagectl_commands_test {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

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
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                      v1::GetJobResponse* resp) override {
    {
      absl::MutexLock lock(&mu_);
      got_ = *req;
    }
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
  v1::GetJobRequest got() {
    absl::MutexLock lock(&mu_);
    return got_;
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
  v1::GetJobRequest got_ ABSL_GUARDED_BY(mu_);
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

TEST_F(CommandsTest, SubmitRefusesASpecThatIsNotUtf8SayingWhere) {
  const std::string path = Path("latin1.yaml");
  std::ofstream(path) << "name: t\n# caf\xE9\nmodel: {builtin: {family: mlp}}\n";
  EXPECT_EQ(Run(OutputFormat::kTable, [&](Commands& c) { return c.Submit(path, false); }), 1);
  EXPECT_THAT(err_.str(), HasSubstr("is not UTF-8 text: the byte at line 2, column 6 (byte 13): "
                                    "0xE9 is not valid UTF-8"));
  EXPECT_TRUE(fake_.submitted().spec_yaml().empty()) << "nothing was sent";
}

TEST_F(CommandsTest, StatusAsksForASummaryUnlessTheHistoryIsWanted) {
  ASSERT_EQ(Run(OutputFormat::kJson, [](Commands& c) { return c.Status("job-7"); }), 0);
  EXPECT_FALSE(fake_.got().history_all());
  EXPECT_EQ(fake_.got().history_limit(), 0);
  HistoryRequest all;
  all.all = true;
  ASSERT_EQ(Run(OutputFormat::kJson, [&](Commands& c) { return c.Status("job-7", all); }), 0);
  EXPECT_TRUE(fake_.got().history_all());
  HistoryRequest page;
  page.from = 100;
  page.steps = 50;
  ASSERT_EQ(Run(OutputFormat::kJson, [&](Commands& c) { return c.Status("job-7", page); }), 0);
  EXPECT_EQ(fake_.got().history_from(), 100);
  EXPECT_EQ(fake_.got().history_limit(), 50);
  EXPECT_EQ(nlohmann::json::parse(out_.str())["history_first_step"], 0);
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
}  // namespace stagecoach::client::stagectl_commands_test
