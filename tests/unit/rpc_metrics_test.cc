// RPC latency by method and status code: a real gRPC server started by StartServer with a
// registry (ServerOptions::metrics) observes every call it serves, here grpc.health.v1 checks
// made through a generic stub, in stagecoach_rpc_server_duration_seconds. Plus the method and
// code labels.
#include "common/rpc/rpc_metrics.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/rpc/server.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace stagecoach::rpc::rpc_metrics_test {
namespace {

// Calls `method` (a full path) with an empty request; returns the call's status.
grpc::Status Call(int port, const std::string& method) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  grpc::Slice empty("");  // HealthCheckRequest{service: ""} serializes to no bytes
  grpc::ByteBuffer request(&empty, 1), response;
  auto call = stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, call.get());
  void* tag = nullptr;
  bool ok = false;
  EXPECT_EQ(cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(10)),
            grpc::CompletionQueue::GOT_EVENT);
  return status;
}

// The histogram's sample count for {method, code}; -1 when there is no such series.
double Count(const prometheus::Registry& registry, const std::string& method,
             const std::string& code) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != kRpcServerDurationMetric) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      if (labels == std::map<std::string, std::string>{{"method", method}, {"code", code}}) {
        return static_cast<double>(m.histogram.sample_count);
      }
    }
  }
  return -1;
}

TEST(RpcMetrics, ServerObservesEveryCallByMethodAndCode) {
  prometheus::Registry registry;
  ServerOptions options;
  options.metrics = &registry;
  auto started = StartServer(HostPort{"127.0.0.1", 0}, {}, options);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(Count(registry, "Health/Check", "OK"), -1);

  for (int i = 0; i < 3; ++i) {
    grpc::Status status = Call(started->port, "/grpc.health.v1.Health/Check");
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  // A health check of a service the server does not know: NOT_FOUND.
  // (HealthCheckRequest{service: "nope"}: field 1, length 4.)
  {
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", started->port),
                                       grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    grpc::Slice slice(std::string("\x0a\x04nope", 6));
    grpc::ByteBuffer request(&slice, 1), response;
    auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&response, &status, call.get());
    void* tag = nullptr;
    bool ok = false;
    ASSERT_EQ(cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(10)),
              grpc::CompletionQueue::GOT_EVENT);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  }
  started->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));

  EXPECT_EQ(Count(registry, "Health/Check", "OK"), 3);
  EXPECT_EQ(Count(registry, "Health/Check", "NOT_FOUND"), 1);
  const std::string text = metrics::SerializeText(registry);
  EXPECT_NE(text.find("stagecoach_rpc_server_duration_seconds_count{code=\"OK\",method=\"Health/"
                      "Check\"} 3"),
            std::string::npos)
      << text;
  // Durations are observed in seconds: a loopback health check takes well under 10 s.
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != kRpcServerDurationMetric) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      EXPECT_GE(m.histogram.sample_sum, 0);
      EXPECT_LT(m.histogram.sample_sum, 10);
      EXPECT_EQ(m.histogram.bucket.size(), metrics::DurationBucketsSeconds().size() + 1);
    }
  }
}

TEST(RpcMetrics, Labels) {
  EXPECT_EQ(RpcMethodLabel("/stagecoach.v1.CoordinatorService/SubmitJob"),
            "CoordinatorService/SubmitJob");
  EXPECT_EQ(RpcMethodLabel("/grpc.health.v1.Health/Check"), "Health/Check");
  EXPECT_EQ(RpcMethodLabel("/Plain/Method"), "Plain/Method");
  EXPECT_EQ(RpcMethodLabel("odd"), "odd");
  EXPECT_EQ(RpcCodeLabel(0), "OK");
  EXPECT_EQ(RpcCodeLabel(static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED)),
            "DEADLINE_EXCEEDED");
  EXPECT_EQ(RpcCodeLabel(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)), "UNAUTHENTICATED");
  EXPECT_EQ(RpcCodeLabel(99), "99");
}

}  // namespace
}  // namespace stagecoach::rpc::rpc_metrics_test
