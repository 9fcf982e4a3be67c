// The standard gRPC surfaces on every server, as tools and Kubernetes probes reach them: the
// coordinator and worker processes answer grpc.health.v1.Health/Check with SERVING, and server
// reflection lists their services. The calls are made with raw protobuf bytes through a generic
// stub, so this test depends on neither service's generated code.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::testing::grpc_surfaces_test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(10);

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + kTimeout;
}

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string String(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// Waits for the completion of `want` on `cq`; false on a timeout or a failed operation.
bool Await(grpc::CompletionQueue& cq, void* want) {
  void* tag = nullptr;
  bool ok = false;
  if (cq.AsyncNext(&tag, &ok, Deadline()) != grpc::CompletionQueue::GOT_EVENT) return false;
  EXPECT_EQ(tag, want);
  return ok;
}

// grpc.health.v1.Health/Check of the whole server (service ""): the serialized response.
std::string HealthCheck(const std::string& address, grpc::Status* status) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  grpc::CompletionQueue cq;
  // HealthCheckRequest{service: ""} serializes to no bytes.
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", Bytes(""), &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  call->Finish(&response, status, call.get());
  EXPECT_TRUE(Await(cq, call.get()));
  return status->ok() ? String(response) : std::string();
}

// grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo with list_services: the raw
// first response (it holds the service names as strings).
std::string ListServices(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  int start = 0, write = 0, done = 0, read = 0, finish = 0;
  call->StartCall(&start);
  if (!Await(cq, &start)) return "";
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
  call->Write(Bytes(std::string("\x3a\x00", 2)), &write);
  if (!Await(cq, &write)) return "";
  call->WritesDone(&done);
  if (!Await(cq, &done)) return "";
  grpc::ByteBuffer response;
  call->Read(&response, &read);
  const bool got = Await(cq, &read);
  grpc::Status status;
  call->Finish(&status, &finish);
  Await(cq, &finish);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return got ? String(response) : std::string();
}

TEST(GrpcSurfacesTest, EveryServerAnswersHealthChecksAndReflection) {
  ClusterOptions options;
  options.workers = 1;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForIdleWorkers(1, absl::Seconds(30)).ok()) << (*cluster)->Logs();
  auto workers = (*cluster)->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);

  struct Server {
    std::string what, address, service;
  };
  for (const Server& server :
       {Server{"coordinator", (*cluster)->coordinator_address(),
               "stagecoach.v1.CoordinatorService"},
        Server{"worker", (*workers)[0].address(), "stagecoach.v1.WorkerService"}}) {
    grpc::Status status;
    // HealthCheckResponse{status: SERVING (1)}.
    EXPECT_EQ(HealthCheck(server.address, &status), std::string("\x08\x01", 2))
        << server.what << ": " << status.error_message();
    const std::string services = ListServices(server.address);
    EXPECT_TRUE(absl::StrContains(services, server.service)) << server.what << ": " << services;
    EXPECT_TRUE(absl::StrContains(services, "grpc.health.v1.Health")) << server.what;
  }
}

}  // namespace
}  // namespace stagecoach::testing::grpc_surfaces_test
