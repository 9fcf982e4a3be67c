// Security with real processes on loopback: TLS on every hop (a job runs, a plaintext client is
// refused), mutual TLS (a client with a certificate from another CA, or with none, is refused on
// every CoordinatorService and WorkerService RPC; the right certificate gets through), bearer
// tokens (every client and worker RPC refused with a wrong or missing token, answered with the
// right one; workers refuse calls without their coordinator's session token while the
// coordinator's own calls run a job), and --check-config on the security flags. Certificates
// are made with the openssl command line in the test's temporary directory.
#include <google/protobuf/descriptor.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/channel.h"
#include "common/rpc/tls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"
#include "stagecoach/v1/worker.grpc.pb.h"
#include "tests/support/job_predicates.h"
#include "tests/support/local_cluster.h"

namespace stagecoach::testing::security_test {
namespace {

using ::testing::HasSubstr;

// Worker RPCs of CoordinatorService (the rest are client RPCs); FetchArtifact takes either token.
const std::set<std::string>& WorkerMethods() {
  static const auto* methods = new std::set<std::string>{
      "RegisterWorker", "Heartbeat", "ReportStep", "ReportTaskEnd", "SettleStep",
      "ReportSnapshot", "SetKey",    "GetKey",     "WaitKeys",      "FetchArtifact"};
  return *methods;
}

std::string MlpSpec(const std::string& name) {
  return absl::StrCat("name: ", name, "\n",
                      "model:\n  builtin: {family: mlp, sizes: [8, 16, 16, 4], seed: 1}\n",
                      "split: {stages: 2}\n", "schedule: {kind: 1F1B, microbatches: 2}\n",
                      "training: {batch_size: 8, steps: 3, loss: mse}\n");
}

// The openssl binary on PATH, or empty.
std::string OpensslBinary() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir, "/openssl");
    if (std::ifstream(candidate).good()) return candidate;
  }
  return "";
}

// A CA, a server certificate (SAN IP:127.0.0.1 and DNS:localhost, for server and client use:
// the daemons present it both ways), a client certificate, and a rogue CA with its own client
// certificate. EC P-256 keys, so that generating them is quick.
struct Certificates {
  std::string ca, server_cert, server_key, client_cert, client_key, rogue_ca, rogue_cert, rogue_key;
};

absl::Status Openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {OpensslBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = RunCommand(argv, absl::Seconds(30));
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat("openssl ", absl::StrJoin(args, " "), ": exit ", r.exit_code, ": ", r.err));
  }
  return absl::OkStatus();
}

absl::StatusOr<Certificates> MakeCertificates(const std::string& dir) {
  if (OpensslBinary().empty()) return absl::NotFoundError("no openssl binary on PATH");
  auto ca = [&](const std::string& name) {
    return Openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", dir + "/" + name + ".key", "-out",
                    dir + "/" + name + ".pem", "-days", "2", "-subj", "/CN=" + name, "-addext",
                    "basicConstraints=critical,CA:TRUE", "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign"});
  };
  auto leaf = [&](const std::string& name, const std::string& ca_name, const std::string& cn,
                  const std::string& extensions) -> absl::Status {
    const std::string ext = dir + "/" + name + ".ext";
    std::ofstream(ext) << extensions;
    if (auto s = Openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                          "-nodes", "-keyout", dir + "/" + name + ".key", "-out",
                          dir + "/" + name + ".csr", "-subj", "/CN=" + cn});
        !s.ok()) {
      return s;
    }
    return Openssl({"x509", "-req", "-in", dir + "/" + name + ".csr", "-CA",
                    dir + "/" + ca_name + ".pem", "-CAkey", dir + "/" + ca_name + ".key",
                    "-CAcreateserial", "-out", dir + "/" + name + ".pem", "-days", "2", "-extfile",
                    ext});
  };
  for (absl::Status s :
       {ca("ca"), ca("rogue-ca"),
        leaf("server", "ca", "localhost",
             "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
             "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n"),
        leaf("client", "ca", "stagectl",
             "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n"),
        leaf("rogue", "rogue-ca", "stagectl",
             "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")}) {
    if (!s.ok()) return s;
  }
  Certificates c;
  c.ca = dir + "/ca.pem";
  c.server_cert = dir + "/server.pem";
  c.server_key = dir + "/server.key";
  c.client_cert = dir + "/client.pem";
  c.client_key = dir + "/client.key";
  c.rogue_ca = dir + "/rogue-ca.pem";
  c.rogue_cert = dir + "/rogue.pem";
  c.rogue_key = dir + "/rogue.key";
  return c;
}

// A channel to `address` with `files`' TLS (plaintext when none) and `token` on every call.
std::shared_ptr<grpc::Channel> Channel(const std::string& address, const rpc::TlsFiles& files,
                                       const std::string& token = "") {
  auto credentials = rpc::MakeChannelCredentials(files);
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  rpc::ChannelSecurity security;
  if (credentials.ok()) security.credentials = *credentials;
  security.bearer_token = token;
  return rpc::MakeChannel(address, security);
}

// Calls `method` of `service` (full name, e.g. "stagecoach.v1.CoordinatorService") with an
// empty request message, as a generic call, and returns its status.
grpc::Status CallEmpty(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                       const std::string& method) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, absl::Seconds(10));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, absl::StrCat("/", service, "/", method), grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) {
    ctx.TryCancel();
    done.WaitForNotification();
  }
  return status;
}

// The names of every method of `service` (full name), from the generated descriptors.
std::vector<std::string> Methods(const std::string& service) {
  // A message of each proto file, so that the linker keeps both files' descriptors.
  const google::protobuf::FileDescriptor* files[] = {v1::SubmitJobRequest::descriptor()->file(),
                                                     v1::StartTaskRequest::descriptor()->file()};
  const google::protobuf::ServiceDescriptor* descriptor = nullptr;
  for (const auto* file : files) {
    for (int i = 0; i < file->service_count() && descriptor == nullptr; ++i) {
      if (file->service(i)->full_name() == service) descriptor = file->service(i);
    }
  }
  EXPECT_NE(descriptor, nullptr) << service;
  std::vector<std::string> out;
  if (descriptor == nullptr) return out;
  for (int i = 0; i < descriptor->method_count(); ++i) out.push_back(descriptor->method(i)->name());
  return out;
}

const std::string kCoordinatorService = v1::CoordinatorService::service_full_name();
const std::string kWorkerService = v1::WorkerService::service_full_name();

// Expects every method of both services, called on `channel` (coordinator) and
// `worker_channel`, to fail with `code`; `who` names the client in failure messages.
void ExpectEveryRpcRefused(const std::shared_ptr<grpc::Channel>& coordinator_channel,
                           const std::shared_ptr<grpc::Channel>& worker_channel,
                           grpc::StatusCode code, const std::string& who) {
  for (const std::string& method : Methods(kCoordinatorService)) {
    grpc::Status s = CallEmpty(coordinator_channel, kCoordinatorService, method);
    EXPECT_EQ(s.error_code(), code)
        << who << ": CoordinatorService." << method << ": " << s.error_message();
  }
  for (const std::string& method : Methods(kWorkerService)) {
    grpc::Status s = CallEmpty(worker_channel, kWorkerService, method);
    EXPECT_EQ(s.error_code(), code)
        << who << ": WorkerService." << method << ": " << s.error_message();
  }
}

// Submits a small MLP job through the cluster's stagectl and waits for it: SUCCEEDED.
void ExpectJobSucceeds(LocalCluster& c, const std::string& name) {
  const std::string spec = c.WriteFile(name + ".yaml", MlpSpec(name));
  CommandResult submit = c.Stagectl({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err << c.Logs();
  const std::string job_id = LastLine(submit.out);
  ASSERT_FALSE(job_id.empty()) << submit.out;
  auto done = c.WaitForJob(job_id, IsFinal, absl::Seconds(40));
  ASSERT_TRUE(done.ok()) << done.status() << c.Logs();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->reason() << c.Logs();
  EXPECT_EQ(done->steps_done(), 3);
}

// The address of the first worker the coordinator lists.
std::string FirstWorkerAddress(LocalCluster& c) {
  auto workers = c.ListWorkers();
  EXPECT_TRUE(workers.ok()) << workers.status();
  if (!workers.ok() || workers->empty()) return "";
  return workers->front().address();
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto certs = MakeCertificates(dir_.path());
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
  }

  std::string WriteToken(const std::string& name, const std::string& token) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << token << "\n";  // trailing whitespace is trimmed
    return path;
  }

  TempDir dir_;
  Certificates certs_;
};

TEST_F(SecurityTest, TlsOnEveryHopRunsAJobAndRefusesPlaintext) {
  ClusterOptions options;
  options.workers = 2;
  options.tls_ca = certs_.ca;
  options.tls_server_cert = certs_.server_cert;
  options.tls_server_key = certs_.server_key;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ExpectJobSucceeds(c, "tls");

  // A plaintext client cannot talk to a TLS server, neither the coordinator nor a worker.
  auto plain = Channel(c.coordinator_address(), {});
  grpc::Status s = CallEmpty(plain, kCoordinatorService, "ListJobs");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  s = CallEmpty(Channel(FirstWorkerAddress(c), {}), kWorkerService, "GetWorkerStatus");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // Nor does stagectl without --tls-ca.
  CommandResult list = RunCommand(
      {StagectlBinary(), "--coordinator", c.coordinator_address(), "list"}, absl::Seconds(30));
  EXPECT_EQ(list.exit_code, 1) << list.out;
  // A TLS client that trusts another CA refuses the server.
  rpc::TlsFiles other_ca;
  other_ca.ca = certs_.rogue_ca;
  s = CallEmpty(Channel(c.coordinator_address(), other_ca), kCoordinatorService, "ListJobs");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();

  // --health-listen: plaintext health checks for probes that cannot speak TLS (Kubernetes),
  // next to the TLS server, and nothing else there.
  auto daemon = ChildProcess::Start(
      {CoordinatorBinary(), "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0",
       "--tls-cert", certs_.server_cert, "--tls-key", certs_.server_key, "--tls-ca", certs_.ca},
      dir_.path() + "/health-coordinator.log");
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto listening = (*daemon)->ReadLine(absl::Seconds(30));
  ASSERT_TRUE(listening.ok()) << listening.status();
  auto health_line = (*daemon)->ReadLine(absl::Seconds(30));
  ASSERT_TRUE(health_line.ok()) << health_line.status();
  ASSERT_TRUE(absl::StartsWith(*health_line, "health on ")) << *health_line;
  const std::string health = health_line->substr(strlen("health on "));
  s = CallEmpty(Channel(health, {}), "grpc.health.v1.Health", "Check");
  EXPECT_TRUE(s.ok()) << s.error_message();
  s = CallEmpty(Channel(health, {}), kCoordinatorService, "ListJobs");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
  const std::string main_address = listening->substr(listening->rfind(' ') + 1);
  s = CallEmpty(Channel(main_address, {}), "grpc.health.v1.Health", "Check");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << "the main port stays TLS only";
}

TEST_F(SecurityTest, MutualTlsRefusesRogueAndMissingClientCertificatesOnEveryRpc) {
  ClusterOptions options;
  options.workers = 2;
  options.tls_ca = certs_.ca;
  options.tls_server_cert = certs_.server_cert;
  options.tls_server_key = certs_.server_key;
  options.tls_client_cert = certs_.client_cert;
  options.tls_client_key = certs_.client_key;
  options.tls_require_client_cert = true;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // Every hop under mutual TLS: stagectl and the cluster's calls present the client
  // certificate, the coordinator and workers their own to each other.
  ExpectJobSucceeds(c, "mtls");
  const std::string worker = FirstWorkerAddress(c);
  ASSERT_FALSE(worker.empty());

  rpc::TlsFiles rogue{certs_.rogue_cert, certs_.rogue_key, certs_.ca};
  ExpectEveryRpcRefused(Channel(c.coordinator_address(), rogue), Channel(worker, rogue),
                        grpc::StatusCode::UNAVAILABLE, "rogue client certificate");
  rpc::TlsFiles no_cert;
  no_cert.ca = certs_.ca;
  ExpectEveryRpcRefused(Channel(c.coordinator_address(), no_cert), Channel(worker, no_cert),
                        grpc::StatusCode::UNAVAILABLE, "no client certificate");

  // The right certificate gets through the handshake: the coordinator answers, and a worker
  // answers too, refusing the call for want of its coordinator's session token.
  rpc::TlsFiles good{certs_.client_cert, certs_.client_key, certs_.ca};
  grpc::Status s =
      CallEmpty(Channel(c.coordinator_address(), good), kCoordinatorService, "ListWorkers");
  EXPECT_TRUE(s.ok()) << s.error_message();
  s = CallEmpty(Channel(worker, good), kWorkerService, "GetWorkerStatus");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("call not from this worker's coordinator"));
  // stagectl with the rogue certificate is refused.
  CommandResult list =
      RunCommand({StagectlBinary(), "--coordinator", c.coordinator_address(), "--tls-ca", certs_.ca,
                  "--tls-cert", certs_.rogue_cert, "--tls-key", certs_.rogue_key, "list"},
                 absl::Seconds(30));
  EXPECT_EQ(list.exit_code, 1) << list.out;
}

TEST_F(SecurityTest, TokensAreRequiredOnEveryRpcAndWorkersObeyOnlyTheirCoordinator) {
  ClusterOptions options;
  options.workers = 2;
  options.tls_ca = certs_.ca;
  options.tls_server_cert = certs_.server_cert;
  options.tls_server_key = certs_.server_key;
  options.client_token_file = WriteToken("client.token", "client-secret-1234");
  options.worker_token_file = WriteToken("worker.token", "worker-secret-5678");
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // Workers registered with the worker token; the coordinator's calls to them carry their
  // session tokens: a job runs.
  ExpectJobSucceeds(c, "tokens");
  const std::string worker = FirstWorkerAddress(c);
  ASSERT_FALSE(worker.empty());

  rpc::TlsFiles tls;
  tls.ca = certs_.ca;
  for (const std::string& token :
       {std::string(), std::string("client-secret-123"), std::string("worker-secret-5679")}) {
    const std::string who = token.empty() ? "no token" : "wrong token";
    ExpectEveryRpcRefused(Channel(c.coordinator_address(), tls, token), Channel(worker, tls, token),
                          grpc::StatusCode::UNAUTHENTICATED, who);
  }
  // The client token opens the client RPCs only; the worker token the worker RPCs only.
  auto as_client = Channel(c.coordinator_address(), tls, "client-secret-1234");
  auto as_worker = Channel(c.coordinator_address(), tls, "worker-secret-5678");
  for (const std::string& method : Methods(kCoordinatorService)) {
    const bool worker_rpc = WorkerMethods().count(method) > 0;
    grpc::Status right = CallEmpty(worker_rpc ? as_worker : as_client, kCoordinatorService, method);
    EXPECT_NE(right.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << " with the right token: " << right.error_message();
    if (method == "FetchArtifact") continue;  // either token
    grpc::Status other = CallEmpty(worker_rpc ? as_client : as_worker, kCoordinatorService, method);
    EXPECT_EQ(other.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << " with the other token: " << other.error_message();
    EXPECT_THAT(other.error_message(),
                HasSubstr(worker_rpc ? "--worker-token-file" : "--client-token-file"));
    EXPECT_THAT(other.error_message(), ::testing::Not(HasSubstr("secret")));
  }
  // The tokens of the coordinator are not a worker's session token either.
  for (const std::string token : {"client-secret-1234", "worker-secret-5678"}) {
    grpc::Status s = CallEmpty(Channel(worker, tls, token), kWorkerService, "StopTask");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  // stagectl without the token is refused, naming the token; with it (the cluster's) it works.
  CommandResult refused = RunCommand(
      {StagectlBinary(), "--coordinator", c.coordinator_address(), "--tls-ca", certs_.ca, "list"},
      absl::Seconds(30));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("client token"));
  CommandResult listed = c.Stagectl({"workers"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
}

TEST_F(SecurityTest, CheckConfigReadsCertificatesAndTokens) {
  const std::string token = WriteToken("t.token", "abc");
  CommandResult ok = RunCommand(
      {CoordinatorBinary(), "--check-config", "--tls-cert", certs_.server_cert, "--tls-key",
       certs_.server_key, "--tls-ca", certs_.ca, "--tls-require-client-cert", "--client-token-file",
       token, "--worker-token-file", token},
      absl::Seconds(30));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("configuration ok"));
  ok = RunCommand({WorkerBinary(), "--check-config", "--coordinator", "127.0.0.1:1", "--tls-cert",
                   certs_.server_cert, "--tls-key", certs_.server_key, "--tls-ca", certs_.ca,
                   "--coordinator-token-file", token},
                  absl::Seconds(30));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;

  CommandResult missing = RunCommand({CoordinatorBinary(), "--check-config", "--tls-cert",
                                      dir_.path() + "/nope.pem", "--tls-key", certs_.server_key},
                                     absl::Seconds(30));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("--tls-cert"));
  EXPECT_THAT(missing.err, HasSubstr("nope.pem"));
  CommandResult no_ca =
      RunCommand({CoordinatorBinary(), "--check-config", "--tls-cert", certs_.server_cert,
                  "--tls-key", certs_.server_key, "--tls-require-client-cert"},
                 absl::Seconds(30));
  EXPECT_EQ(no_ca.exit_code, 2);
  EXPECT_THAT(no_ca.err, HasSubstr("--tls-ca"));
  CommandResult empty_token =
      RunCommand({WorkerBinary(), "--check-config", "--coordinator", "127.0.0.1:1",
                  "--coordinator-token-file", WriteToken("empty.token", "  ")},
                 absl::Seconds(30));
  EXPECT_EQ(empty_token.exit_code, 2);
  EXPECT_THAT(empty_token.err, HasSubstr("--coordinator-token-file"));
  CommandResult big = RunCommand(
      {CoordinatorBinary(), "--check-config", "--max-message-bytes", "12"}, absl::Seconds(30));
  EXPECT_EQ(big.exit_code, 2);
  EXPECT_THAT(big.err, HasSubstr("--max-message-bytes"));
}

}  // namespace
}  // namespace stagecoach::testing::security_test
