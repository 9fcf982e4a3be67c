// The coordinator's side of a generation session (coordinator/generation/pipeline_decoder.h)
// against a recorded WorkerService.Decode: a step goes through the stages in order, each
// stage's outputs becoming the next one's inputs, with the session's rows, starts and bounds,
// only the last stage asked for its last position; the logits come back by row; a worker's
// error names the job, stage and worker; and the session is ended once on every worker it used
// when the decoder goes, whether the generation ended well or not.
#include "coordinator/generation/pipeline_decoder.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator_test_fakes.h"

namespace stagecoach::coordinator::pipeline_decoder_test {
namespace {

using ::testing::HasSubstr;


struct Call {
  std::string address;
  v1::DecodeRequest request;
};

// Records every call; stage s answers with a [rows, 1, 1] tensor holding s + 1 per row, the
// last stage with logits [rows, 3] = {row, 10 * row, 100 * row}; `fail_stage` answers
// UNAVAILABLE.
class Workers {
 public:
  explicit Workers(int stages, int fail_stage = -1) : stages_(stages), fail_stage_(fail_stage) {}

  PipelineDecoder::DecodeCall Call() {
    return [this](const std::string& address, const v1::DecodeRequest& request,
                  absl::Duration) -> absl::StatusOr<v1::DecodeResponse> {
      calls.push_back({address, request});
      v1::DecodeResponse response;
      if (request.end_session()) return response;
      if (request.stage() == fail_stage_) return absl::UnavailableError("connection refused");
      const int64_t rows = request.rows_size();
      std::vector<float> values;
      if (request.stage() == stages_ - 1) {
        for (int64_t r = 0; r < rows; ++r) {
          const float row = static_cast<float>(request.rows(r));
          values.insert(values.end(), {row, 10 * row, 100 * row});
        }
        *response.mutable_outputs() = FloatTensor({rows, 3}, values);
      } else {
        values.assign(rows, static_cast<float>(request.stage() + 1));
        *response.mutable_outputs() = FloatTensor({rows, 1, 1}, values);
      }
      response.set_cache_bytes(1000 * (request.stage() + 1));
      return response;
    };
  }

  std::vector<struct Call> calls;

 private:
  int stages_, fail_stage_;
};

DecodeRoute Route() {
  DecodeRoute route;
  route.job_id = "job-7";
  route.attempt = 2;
  route.stage_addresses = {"w0:1", "w1:1", "w1:1", "w0:1"};  // a V: stages 0, 3 and 1, 2
  return route;
}

TEST(PipelineDecoder, AStepRunsTheStagesInOrderAndReturnsEachRowsLogits) {
  Workers workers(4);
  {
    PipelineDecoder decoder(workers.Call(), Route(), "sess", 3, 64, 3);
    auto logits = decoder.Step({2, 0}, {5, 7}, {{11}, {12}}, absl::InfiniteFuture());
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_EQ(*logits, (std::vector<std::vector<float>>{{2, 20, 200}, {0, 0, 0}}));
    ASSERT_EQ(workers.calls.size(), 4u);
    const std::vector<std::string> addresses = {"w0:1", "w1:1", "w1:1", "w0:1"};
    for (int s = 0; s < 4; ++s) {
      const v1::DecodeRequest& r = workers.calls[s].request;
      EXPECT_EQ(workers.calls[s].address, addresses[s]);
      EXPECT_EQ(r.job_id(), "job-7");
      EXPECT_EQ(r.attempt(), 2);
      EXPECT_EQ(r.session(), "sess");
      EXPECT_EQ(r.stage(), s);
      EXPECT_EQ(r.session_rows(), 3);
      EXPECT_EQ(r.max_positions(), 64);
      EXPECT_EQ(std::vector<int32_t>(r.rows().begin(), r.rows().end()),
                (std::vector<int32_t>{2, 0}));
      EXPECT_EQ(std::vector<int64_t>(r.starts().begin(), r.starts().end()),
                (std::vector<int64_t>{5, 7}));
      EXPECT_EQ(r.last_position_only(), s == 3);
      if (s == 0) {
        EXPECT_EQ(r.inputs().dtype(), "int64");
        EXPECT_EQ(r.inputs().shape(0), 2);
        EXPECT_EQ(r.inputs().shape(1), 1);
      } else {  // the previous stage's outputs
        float first;
        std::memcpy(&first, r.inputs().data().data(), 4);
        EXPECT_EQ(first, static_cast<float>(s));
      }
    }
    // The workers' latest cache bytes, one figure per worker: w0 (stage 3's), w1 (stage 2's).
    EXPECT_EQ(decoder.cache_bytes(), 4000 + 3000);
  }
  // The session ended once on each of the two workers.
  ASSERT_EQ(workers.calls.size(), 6u);
  std::map<std::string, int> ended;
  for (size_t i = 4; i < 6; ++i) {
    EXPECT_TRUE(workers.calls[i].request.end_session());
    EXPECT_EQ(workers.calls[i].request.session(), "sess");
    ++ended[workers.calls[i].address];
  }
  EXPECT_EQ(ended, (std::map<std::string, int>{{"w0:1", 1}, {"w1:1", 1}}));
}

TEST(PipelineDecoder, AWorkersErrorNamesTheStageAndTheSessionStillEnds) {
  Workers workers(4, /*fail_stage=*/2);
  {
    PipelineDecoder decoder(workers.Call(), Route(), "sess", 1, 64, 3);
    auto logits = decoder.Step({0}, {0}, {{1, 2, 3}}, absl::InfiniteFuture());
    ASSERT_FALSE(logits.ok());
    EXPECT_EQ(logits.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(logits.status().message(),
                HasSubstr("job job-7 stage 2 (worker at w1:1): connection refused"));
    auto late = decoder.Step({0}, {3}, {{4}}, absl::Now() - absl::Seconds(1));
    EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  }
  int ends = 0;
  for (const auto& call : workers.calls) ends += call.request.end_session() ? 1 : 0;
  EXPECT_EQ(ends, 2);
  EXPECT_EQ(workers.calls.size(), 3u + 2u);  // stages 0, 1, 2, then the two ends
}

}  // namespace
}  // namespace stagecoach::coordinator::pipeline_decoder_test
