// Authorisation in one place: a service served behind rpc::AuthorizeEveryCall with the
// coordinator's token policy refuses every call without the right token before any handler
// runs (unary, server-streaming and client-streaming methods alike), and lets the right ones
// through to the service unchanged.
#include "common/rpc/authorized_service.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/rpc/channel.h"
#include "common/rpc/server.h"
#include "coordinator/service/coordinator_auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"

namespace stagecoach::rpc::authorized_service_test {
namespace {

using ::testing::HasSubstr;

// Counts the calls that reach it.
class CountingService final : public v1::CoordinatorService::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                      v1::GetJobResponse* resp) override {
    ++calls;
    resp->mutable_job()->set_id(req->job_id());
    return grpc::Status::OK;
  }
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    ++calls;
    writer->Write(v1::JobEvent());
    return grpc::Status::OK;
  }
  grpc::Status UploadArtifact(grpc::ServerContext*,
                              grpc::ServerReader<v1::UploadArtifactRequest>* reader,
                              v1::UploadArtifactResponse* resp) override {
    ++calls;
    v1::UploadArtifactRequest msg;
    while (reader->Read(&msg)) resp->set_chunks(resp->chunks() + 1);
    return grpc::Status::OK;
  }
  grpc::Status FetchArtifact(grpc::ServerContext*, const v1::FetchArtifactRequest*,
                             grpc::ServerWriter<v1::FetchArtifactResponse>*) override {
    ++calls;
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

class AuthorizedServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto authorized =
        AuthorizeEveryCall(&service_, "stagecoach.v1.CoordinatorService",
                           coordinator::CoordinatorCallCheck({"client-t", "worker-t"}));
    ASSERT_TRUE(authorized.ok()) << authorized.status();
    authorized_ = *std::move(authorized);
    auto started = StartServer(HostPort{"127.0.0.1", 0}, {authorized_.get()});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    address_ = absl::StrCat("127.0.0.1:", started->port);
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  std::unique_ptr<v1::CoordinatorService::Stub> Stub(const std::string& token) {
    ChannelSecurity security;
    security.bearer_token = token;
    return v1::CoordinatorService::NewStub(MakeChannel(address_, security));
  }
  grpc::Status GetJob(const std::string& token) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    v1::GetJobRequest req;
    req.set_job_id("job-1");
    v1::GetJobResponse resp;
    return Stub(token)->GetJob(&ctx, req, &resp);
  }

  // A one-chunk UploadArtifact stream.
  grpc::Status Upload(const std::string& token, v1::UploadArtifactResponse* resp) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    auto writer = Stub(token)->UploadArtifact(&ctx, resp);
    v1::UploadArtifactRequest chunk;
    chunk.set_chunk("bytes");
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  CountingService service_;
  std::unique_ptr<grpc::Service> authorized_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(AuthorizedServiceTest, UnaryCallsNeedTheirMethodsTokenBeforeTheHandlerRuns) {
  for (const std::string token : {"", "worker-t", "wrong"}) {
    grpc::Status refused = GetJob(token);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_THAT(refused.error_message(), HasSubstr("GetJob: needs the client token"));
  }
  EXPECT_EQ(service_.calls.load(), 0) << "no refused call reached the service";
  EXPECT_TRUE(GetJob("client-t").ok());
  EXPECT_EQ(service_.calls.load(), 1);
  // A worker method: the worker token, then the service's own answer (not implemented here).
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  v1::HeartbeatResponse resp;
  grpc::Status beat = Stub("client-t")->Heartbeat(&ctx, {}, &resp);
  EXPECT_EQ(beat.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(beat.error_message(), HasSubstr("Heartbeat: needs the worker token"));
  grpc::ClientContext ctx2;
  SetDeadline(&ctx2, absl::Seconds(10));
  EXPECT_EQ(Stub("worker-t")->Heartbeat(&ctx2, {}, &resp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(AuthorizedServiceTest, StreamsAreRefusedBeforeTheHandlerRunsToo) {
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    auto reader = Stub("")->WatchJob(&ctx, {});
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  v1::UploadArtifactResponse resp;
  grpc::Status refused = Upload("worker-t", &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(refused.error_message(), HasSubstr("UploadArtifact: needs the client token"));
  EXPECT_EQ(service_.calls.load(), 0);
  ASSERT_TRUE(Upload("client-t", &resp).ok());
  EXPECT_EQ(resp.chunks(), 1);
  // FetchArtifact takes either token.
  for (const std::string token : {"client-t", "worker-t"}) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    auto reader = Stub(token)->FetchArtifact(&ctx, {});
    v1::FetchArtifactResponse msg;
    while (reader->Read(&msg)) {
    }
    EXPECT_TRUE(reader->Finish().ok()) << token;
  }
  EXPECT_EQ(service_.calls.load(), 3);
}

TEST(AuthorizeEveryCall, AnUnknownServiceIsRefused) {
  v1::CoordinatorService::Service service;
  auto refused = AuthorizeEveryCall(
      &service, "stagecoach.v1.NoSuchService",
      [](const grpc::ServerContext&, absl::string_view) { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsNotFound(refused.status()));
}

}  // namespace
}  // namespace stagecoach::rpc::authorized_service_test
