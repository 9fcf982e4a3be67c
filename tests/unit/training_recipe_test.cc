// The training recipe's torch-free parts: the learning-rate schedule (common/spec/learning_rate.h)
// at the points its definition fixes, and the coordinator's TrainingRecord (skipped steps in a
// row, what a restart drops, the job record round trip).
#include <cmath>

#include "common/spec/learning_rate.h"
#include "coordinator/jobs/training_record.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::training_recipe_test {
namespace {

using ::testing::ElementsAre;

spec::LrScheduleSpec Schedule(const std::string& kind, int64_t warmup, double min_lr) {
  spec::LrScheduleSpec s;
  s.kind = kind;
  s.warmup_steps = warmup;
  s.min_lr = min_lr;
  return s;
}

TEST(LearningRate, ConstantWithWarmupRisesToTheBaseAndStays) {
  const auto s = Schedule("constant", 3, 0);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 0.4, 0, 10), 0.1);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 0.4, 2, 10), 0.3);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 0.4, 3, 10), 0.4);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 0.4, 9, 10), 0.4);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 0.4, 50, 10), 0.4);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(Schedule("constant", 0, 0), 0.4, 0, 10), 0.4);
}

TEST(LearningRate, LinearDecaysFromTheBaseAtTheWarmupsEndToMinLrAtTheLastStep) {
  const auto s = Schedule("linear", 2, 0.1);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 1.0, 0, 12), 1.0 / 3);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 1.0, 2, 12), 1.0);
  // T-1-w = 9 steps of decay: 0.1 a step.
  EXPECT_NEAR(spec::LearningRateAt(s, 1.0, 5, 12), 0.7, 1e-15);
  EXPECT_EQ(spec::LearningRateAt(s, 1.0, 11, 12), 0.1);
  // Past the timeline (RunSteps): min_lr.
  EXPECT_EQ(spec::LearningRateAt(s, 1.0, 30, 12), 0.1);
}

TEST(LearningRate, CosineFollowsHalfACosineToMinLr) {
  const auto s = Schedule("cosine", 0, 0.0);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 2.0, 0, 11), 2.0);
  EXPECT_NEAR(spec::LearningRateAt(s, 2.0, 5, 11), 1.0, 1e-15);
  EXPECT_NEAR(spec::LearningRateAt(s, 2.0, 2, 11), 1.0 + std::cos(M_PI * 0.2), 1e-15);
  EXPECT_EQ(spec::LearningRateAt(s, 2.0, 10, 11), 0.0);
}

TEST(LearningRate, AWarmupPastTheTimelineEndsAtMinLrOnItsLastStep) {
  const auto s = Schedule("cosine", 10, 0.01);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 1.0, 0, 5), 1.0 / 11);
  EXPECT_DOUBLE_EQ(spec::LearningRateAt(s, 1.0, 3, 5), 4.0 / 11);
  EXPECT_EQ(spec::LearningRateAt(s, 1.0, 4, 5), 0.01);
  EXPECT_EQ(spec::LearningRateAt(Schedule("linear", 0, 0.5), 1.0, 0, 1), 0.5);
}

TEST(TrainingRecord, CountsTheSkippedStepsInARowAndForgetsWhatARestartReruns) {
  coordinator::TrainingRecord r;
  EXPECT_EQ(r.ConsecutiveSkipped(), 0);
  r.AddStep(0, 0.1, 1.5, false);
  r.AddStep(1, 0.1, std::nullopt, true);
  EXPECT_EQ(r.ConsecutiveSkipped(), 1);
  r.AddStep(2, 0.1, std::nullopt, true);
  EXPECT_EQ(r.ConsecutiveSkipped(), 2);
  r.AddEval(2, 0.25);
  r.AddStep(3, 0.05, 2.0, false);
  EXPECT_EQ(r.ConsecutiveSkipped(), 0);
  r.AddStep(4, 0.05, std::nullopt, true);
  EXPECT_EQ(r.ConsecutiveSkipped(), 1);
  EXPECT_THAT(r.skipped_steps, ElementsAre(1, 2, 4));

  v1::Job record;
  record.set_global_steps_done(5);
  r.ToProto(&record);
  EXPECT_EQ(record.consecutive_skipped_steps(), 1);
  EXPECT_DOUBLE_EQ(record.learning_rate(), 0.05);
  EXPECT_FALSE(record.has_grad_norm());
  coordinator::TrainingRecord loaded;
  loaded.FromProto(record);
  EXPECT_THAT(loaded.skipped_steps, ElementsAre(1, 2, 4));
  EXPECT_EQ(loaded.ConsecutiveSkipped(), 1);
  ASSERT_EQ(loaded.evals.size(), 1u);
  EXPECT_EQ(loaded.evals[0].global_step(), 2);

  // A restart from the checkpoint after step 2 re-runs steps 2, 3 and 4.
  loaded.DropFrom(2);
  EXPECT_THAT(loaded.skipped_steps, ElementsAre(1));
  EXPECT_TRUE(loaded.evals.empty());
  EXPECT_EQ(loaded.last_step, 1);
  EXPECT_EQ(loaded.ConsecutiveSkipped(), 1);
}

}  // namespace
}  // namespace stagecoach::training_recipe_test
