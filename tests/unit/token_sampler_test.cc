// The coordinator's token sampling for generation (coordinator/generation/token_sampler.h) and
// the tensors generation sends and reads (coordinator/generation/pipeline_decoder.h): greedy
// picks, top-k, seeded draws that follow the softmax, and the shapes checked on the way back.
#include "coordinator/generation/token_sampler.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "coordinator/generation/pipeline_decoder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::token_sampler_test {
namespace {

using ::testing::HasSubstr;

TEST(TokenSampler, GreedyTakesTheLargestLogitAndTheLowestIndexOnTies) {
  TokenSampler greedy({0.0, 0, 1});
  EXPECT_EQ(greedy.Next(std::vector<float>{0.1f, 2.0f, -1.0f, 1.9f}), 1);
  EXPECT_EQ(greedy.Next(std::vector<float>{3.0f, 1.0f, 3.0f}), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(greedy.Next(std::vector<float>{nan, -5.0f, nan}), 1);
  EXPECT_EQ(greedy.Next(std::vector<float>{nan, nan}), 0);
}

TEST(TokenSampler, TopOneIsGreedyAtAnyTemperature) {
  TokenSampler top1({2.0, 1, 7});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(top1.Next(std::vector<float>{0.5f, 0.4f, 0.6f}), 2);
}

TEST(TokenSampler, DrawsFollowTheSoftmaxOfLogitsOverTemperature) {
  // softmax([0, log 3]) = [0.25, 0.75]; at temperature 2: [1, sqrt 3] / (1 + sqrt 3).
  const std::vector<float> logits = {0.0f, static_cast<float>(std::log(3.0))};
  for (double temperature : {1.0, 2.0}) {
    TokenSampler sampler({temperature, 0, 11});
    int ones = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ones += sampler.Next(logits);
    const double want = temperature == 1.0 ? 0.75 : std::sqrt(3.0) / (1 + std::sqrt(3.0));
    EXPECT_NEAR(ones / static_cast<double>(n), want, 0.015) << "temperature " << temperature;
  }
}

TEST(TokenSampler, TopKDrawsOnlyAmongTheKLargest) {
  TokenSampler sampler({5.0, 2, 3});
  std::vector<int> seen(5);
  for (int i = 0; i < 2000; ++i) ++seen[sampler.Next(std::vector<float>{1, 4, 2, 4, 3})];
  EXPECT_EQ(seen[0] + seen[2] + seen[4], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[3], 0);
}

TEST(TokenSampler, TheSameSeedGivesTheSameTokens) {
  const std::vector<float> flat(50, 0.0f);
  auto draws = [&](uint64_t seed) {
    TokenSampler s({1.0, 0, seed});
    std::vector<int> out;
    for (int i = 0; i < 40; ++i) out.push_back(s.Next(flat));
    return out;
  };
  EXPECT_EQ(draws(9), draws(9));
  EXPECT_NE(draws(9), draws(10));
}

TEST(TokenSampler, OptionsOutOfRangeNameTheField) {
  EXPECT_THAT(std::string(ValidateSamplingOptions({-0.5, 0, 0}).message()),
              HasSubstr("temperature: must be in [0, 100]"));
  EXPECT_THAT(std::string(ValidateSamplingOptions({std::nan(""), 0, 0}).message()),
              HasSubstr("temperature"));
  EXPECT_THAT(std::string(ValidateSamplingOptions({1.0, -1, 0}).message()), HasSubstr("top_k"));
  EXPECT_TRUE(ValidateSamplingOptions({0.0, 0, 0}).ok());
}

TEST(GenerationTensors, TokenRowsAreInt64RowsInOrder) {
  const v1::TensorData rows = TokenRows({{5, 6, 7}, {8, 9, 10}});
  EXPECT_EQ(rows.dtype(), "int64");
  ASSERT_EQ(rows.shape_size(), 2);
  EXPECT_EQ(rows.shape(0), 2);
  EXPECT_EQ(rows.shape(1), 3);
  std::vector<int64_t> values(6);
  ASSERT_EQ(rows.data().size(), 48u);
  std::memcpy(values.data(), rows.data().data(), 48);
  EXPECT_EQ(values, (std::vector<int64_t>{5, 6, 7, 8, 9, 10}));
}


TEST(GenerationTensors, RowLogitsSplitTheLastStagesOutputsByRow) {
  const v1::TensorData out = FloatTensor({2, 3}, {0, 1, 2, 3, 4, 5});
  auto logits = RowLogits(out, 2, 3, "job-1");
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(*logits, (std::vector<std::vector<float>>{{0, 1, 2}, {3, 4, 5}}));
  auto wrong = RowLogits(out, 2, 4, "job-1");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("job job-1's last stage returned float32[2, 3], not float32 logits "
                        "[2, 4]"));
}

}  // namespace
}  // namespace stagecoach::coordinator::token_sampler_test
