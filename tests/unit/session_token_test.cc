// The worker's session token check (worker/service/coordinator_session.h): a coordinator's call
// that arrives before the worker has read its RegisterWorker answer waits for the token instead
// of being refused; without a registration the call is refused after the grace.
#include <grpcpp/server_context.h>

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/service/coordinator_session.h"

namespace stagecoach::worker::session_token_test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(SessionToken, ACallBeforeTheRegistrationIsReadWaitsForTheToken) {
  SessionToken token(absl::Seconds(10));
  std::thread registration([&token] {
    absl::SleepFor(absl::Milliseconds(100));
    token.Set("session-1");
  });
  grpc::ServerContext ctx;  // carries no bearer token: refused, but as a wrong token
  const absl::Time start = absl::Now();
  const absl::Status status = token.Check(ctx);
  const absl::Duration waited = absl::Now() - start;
  registration.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(status.message(), Not(HasSubstr("not registered yet"))) << status;
  EXPECT_GE(waited, absl::Milliseconds(90));
  EXPECT_LT(waited, absl::Seconds(5)) << "the registration ended the wait, not the grace";
}

TEST(SessionToken, WithoutARegistrationTheCallIsRefusedAfterTheGrace) {
  SessionToken token(absl::Milliseconds(150));
  grpc::ServerContext ctx;
  const absl::Time start = absl::Now();
  const absl::Status status = token.Check(ctx);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(140));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(status.message(), HasSubstr("the worker is not registered yet"));
}

}  // namespace
}  // namespace stagecoach::worker::session_token_test
