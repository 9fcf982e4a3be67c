// A batch too large for one gRPC message (client/message_size.h): refused before it is sent,
// naming the limit and the rows that fit, by the pure check and by `stagectl infer` and `step`
// on a 600000 x 32 float32 file (73.2 MiB; the limit is 64 MiB) with no coordinator to reach;
// and gRPC's own "larger than max" failures explained.
#include "client/message_size.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::client::message_size_test {
namespace {

using ::testing::HasSubstr;

v1::TensorData Float32(int64_t rows, int64_t cols) {
  v1::TensorData t;
  t.set_dtype("float32");
  t.add_shape(rows);
  t.add_shape(cols);
  t.set_data(std::string(rows * cols * 4, '\0'));
  return t;
}

TEST(OversizeBatchError, WithinTheLimitIsNoError) {
  EXPECT_FALSE(OversizeBatchError(1000, Float32(10, 4), "INPUT", "x.npy", nullptr, 1000));
}

TEST(OversizeBatchError, NamesTheSizeTheLimitAndTheRowsThatFit) {
  // 100 rows of 16 bytes (1,600) plus 100 bytes of the rest of the request, a limit of 1,000:
  // (1000 - 100 - 64) / 16 = 52 rows fit.
  const v1::TensorData batch = Float32(100, 4);
  auto error = OversizeBatchError(1700, batch, "INPUT", "x.npy", nullptr, 1000);
  ASSERT_TRUE(error.has_value());
  EXPECT_THAT(*error, HasSubstr("INPUT: 'x.npy' (float32[100, 4]) makes a request of 1.7 KiB, "
                                "over the 1000 B one call to the coordinator may carry"));
  EXPECT_THAT(*error, HasSubstr("split it into batches of at most 52 of its 100 rows"));
  // Targets of 4 bytes a row ride along: (1000 - (2100 - 2000) - 64) / 20 = 41.
  const v1::TensorData targets = Float32(100, 1);
  auto with_targets = OversizeBatchError(2100, batch, "--inputs", "x.npy", &targets, 1000);
  ASSERT_TRUE(with_targets.has_value());
  EXPECT_THAT(*with_targets, HasSubstr("at most 41 of its 100 rows"));
}

TEST(MessageLimitHint, ExplainsGrpcsOwnLimitAndNothingElse) {
  auto hint = MessageLimitHint("Sent message larger than max (76800291 vs. 67108864)");
  ASSERT_TRUE(hint.has_value());
  EXPECT_THAT(*hint, HasSubstr("exceeded the 64.0 MiB gRPC carries"));
  EXPECT_THAT(*hint, HasSubstr("send a smaller batch"));
  EXPECT_FALSE(MessageLimitHint("job j-1 is not running"));
}

class OversizeCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("message_size_", getpid());
    std::filesystem::create_directories(dir_);
    big_ = (dir_ / "big.npy").string();
    ASSERT_TRUE(WriteNpy(big_, Float32(600000, 32)).ok());
    spec_ = (dir_ / "spec.yaml").string();
    std::system(absl::StrCat("echo 'name: x' > '", spec_, "'").c_str());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // No coordinator listens there: the commands must refuse before calling it.
  Commands Make() {
    ClientOptions options;
    options.coordinator = "127.0.0.1:1";
    options.timeout = absl::Seconds(2);
    return Commands(options, out_, err_);
  }

  std::filesystem::path dir_;
  std::string big_, spec_;
  std::ostringstream out_, err_;
};

TEST_F(OversizeCommandTest, InferRefusesABatchOverTheMessageLimit) {
  Commands commands = Make();
  EXPECT_EQ(commands.Infer(spec_, big_, "", absl::Seconds(5)), 1);
  EXPECT_THAT(err_.str(),
              HasSubstr(absl::StrCat("stagectl: infer: INPUT: '", big_,
                                     "' (float32[600000, 32]) makes a request of 73.2 MiB, over "
                                     "the 64.0 MiB one call to the coordinator may carry")));
  EXPECT_THAT(err_.str(), HasSubstr("split it into batches of at most 524286 of its 600000 rows"));
  EXPECT_THAT(err_.str(), ::testing::Not(HasSubstr("cannot reach")));
}

TEST_F(OversizeCommandTest, StepRefusesABatchOverTheMessageLimit) {
  Commands commands = Make();
  StepOptions options;
  options.inputs = big_;
  options.forward_only = true;
  EXPECT_EQ(commands.Step("j-1", options), 1);
  EXPECT_THAT(err_.str(), HasSubstr("stagectl: step: --inputs: '"));
  EXPECT_THAT(err_.str(), HasSubstr("over the 64.0 MiB"));
}

}  // namespace
}  // namespace stagecoach::client::message_size_test
