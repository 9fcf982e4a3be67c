// stagectl's pure rendering functions: the live watch view's progress line, ETA, state lines
// and event JSON, and the job details `status` prints.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/render/render.h"
#include "client/render/render_balance.h"
#include "client/render/watch.h"
#include "common/rpc/time_conversion.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/stagectl_test_events.h"

namespace stagecoach::client::stagectl_render_test {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

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
  // The bubble: the step's mean over its ranks (0.25 and 0.5) and its worst rank.
  EXPECT_EQ(StepLine(state),
            "step 12/40  loss 0.123457  800 samples/s  0.042s/step  bubble 0.375 mean, 0.500 "
            "worst (rank 1)  ETA 1s");
  // With replicas, the worst task is named by replica and rank.
  v1::JobEvent replicated = StepEvent(2, 11, 40, 0.1, absl::Milliseconds(42), {0.1, 0.2, 0.4, 0.3});
  replicated.mutable_step_completed()->set_num_ranks(2);
  WatchState two;
  ApplyEvent(replicated, &two);
  EXPECT_THAT(StepLine(two), HasSubstr("bubble 0.250 mean, 0.400 worst (replica 1 rank 0)"));

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
              AllOf(StartsWith("["), HasSubstr("] 10/40 loss 0.5000 800/s 1.000s/step bubble "
                                               "0.38/0.50@r1 ETA 30s")));
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
  EXPECT_THAT(details, HasSubstr("Loss:      0.500000 (step 0) -> skipped (step 1, latest shown)"));
  EXPECT_THAT(details, HasSubstr("LR:        0.00025 (latest step); grad norm 0.75"));
  EXPECT_THAT(details, HasSubstr("Skipped:   2 steps (non-finite gradients), global steps 12, 39; "
                                 "1 in a row now"));
  EXPECT_THAT(details, HasSubstr("Eval loss: 0.300000 after global step 30 (1 passes)"));
  const nlohmann::json json = JobJson(job);
  EXPECT_TRUE(json["losses"][1].is_null());
  EXPECT_EQ(json["skipped_steps"], nlohmann::json::array({12, 39}));
  EXPECT_DOUBLE_EQ(json["evals"][0]["loss"].get<double>(), 0.3);
}

// How the layers were split, the bubble as a mean over the ranks and its worst rank, and the
// per-rank table of predicted against measured compute and bubble.
TEST(RenderJobTest, ShowsTheSplitAndEachRanksPredictedAndMeasuredShare) {
  v1::Job job;
  job.set_id("job-3");
  job.set_split("profiled (default: profiling the model was cheap)");
  job.add_max_bubble_ratios(0.4);
  job.add_max_bubble_ratios(0.3);
  job.set_predicted_compute_in_seconds(true);
  job.set_balance_step(41);
  for (int r = 0; r < 2; ++r) {
    v1::RankBalance* b = job.add_balance();
    b->set_rank(r);
    b->add_stages(r);
    b->add_stages(3 - r);
    b->set_predicted_compute(0.010 + r * 0.002);
    b->set_predicted_bubble_ratio(0.1 * (r + 1));
    b->set_measured_compute_seconds(0.011 + r * 0.002);
    b->set_measured_bubble_ratio(r == 0 ? 0.25 : 0.15);
    b->set_simulated_bubble_ratio(r == 0 ? 0.2 : 0.1);
  }
  const std::string details = JobDetails(job);
  EXPECT_THAT(details, HasSubstr("Split:     profiled (default: profiling the model was cheap)"));
  EXPECT_THAT(details, HasSubstr("Bubble:    0.200 mean, 0.250 worst (rank 0) in global step 41; "
                                 "worst step shown 0.400 (on its worst rank)"));
  EXPECT_THAT(details, HasSubstr("PREDICTED COMPUTE"));
  EXPECT_THAT(details, HasSubstr("SIMULATED BUBBLE"));
  const std::string table = BalanceTable(job);
  EXPECT_THAT(table, AllOf(HasSubstr("0,3"), HasSubstr("10.00 ms"), HasSubstr("13.00 ms"),
                           HasSubstr("0.250"), HasSubstr("0.100")));
  const nlohmann::json json = JobJson(job);
  EXPECT_EQ(json["balance"]["balance_step"], 41);
  EXPECT_DOUBLE_EQ(json["balance"]["ranks"][1]["simulated_bubble_ratio"].get<double>(), 0.1);

  // Predictions alone (not profiled: shares of the step), before any step was traced.
  v1::Job planned;
  planned.set_balance_step(-1);
  v1::RankBalance* b = planned.add_balance();
  b->set_predicted_compute(0.55);
  const std::string only = BalanceTable(planned);
  EXPECT_THAT(only, AllOf(HasSubstr("PREDICTED SHARE"), HasSubstr("55.0%"),
                          Not(HasSubstr("MEASURED"))));
  EXPECT_EQ(BubbleSummary({0.1, 0.4, 0.3, 0.2}, 2), "0.250 mean, 0.400 worst (rank 1)");
  EXPECT_EQ(BubbleSummary({0.1, 0.2, 0.5, 0.2}, 2), "0.250 mean, 0.500 worst (replica 1 rank 0)");
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

}  // namespace
}  // namespace stagecoach::client::stagectl_render_test
