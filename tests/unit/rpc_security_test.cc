// Token files, bearer checks and TLS credential builders (common/rpc/auth.h, common/rpc/tls.h):
// what is accepted, and that every refusal names the flag and file. Handshakes and per-RPC
// refusals are covered end to end by tests/e2e/security_test.cc.
#include <grpcpp/server_context.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "common/rpc/auth.h"
#include "common/rpc/tls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::rpc::rpc_security_test {
namespace {

using ::testing::HasSubstr;

// A fresh directory under /tmp, removed with its files at the end of the test.
using ScratchDir = stagecoach::testing::TempDir;

std::string Write(const ScratchDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ReadTokenFile, TrimsWhitespaceAndRefusesEmptyMissingOrSpacedTokens) {
  ScratchDir dir;
  auto token = ReadTokenFile(Write(dir, "ok", "  s3cret-token\n"), "--token-file");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret-token");

  auto empty = ReadTokenFile(Write(dir, "empty", " \n\t"), "--client-token-file");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("--client-token-file"));
  EXPECT_THAT(empty.status().message(), HasSubstr("empty"));

  auto missing = ReadTokenFile(dir.path() + "/nope", "--worker-token-file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("--worker-token-file"));
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));

  auto spaced = ReadTokenFile(Write(dir, "spaced", "two words"), "--token-file");
  EXPECT_EQ(spaced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spaced.status().message(), ::testing::Not(HasSubstr("two words")));
}

TEST(ConstantTimeEquals, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(CheckBearer, RefusesACallWithoutAuthorizationMetadata) {
  grpc::ServerContext ctx;  // a context no call filled: no client metadata
  absl::Status s = CheckBearer(ctx, "tok", "ListJobs: needs the client token");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), HasSubstr("ListJobs: needs the client token"));
  EXPECT_THAT(s.message(), HasSubstr("no authorization metadata"));
}

TEST(TlsCredentials, NoFilesMeansPlaintextAndInconsistentSetsNameTheFlag) {
  auto server = MakeServerCredentials({});
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(*server, nullptr);
  auto channel = MakeChannelCredentials({});
  ASSERT_TRUE(channel.ok());
  EXPECT_NE(*channel, nullptr);

  TlsFiles key_only;
  key_only.key = "k.pem";
  EXPECT_THAT(MakeServerCredentials(key_only).status().message(), HasSubstr("--tls-key"));
  EXPECT_THAT(MakeChannelCredentials(key_only).status().message(), HasSubstr("--tls-key"));

  TlsFiles require_without_ca{"c.pem", "k.pem", "", true};
  EXPECT_THAT(MakeServerCredentials(require_without_ca).status().message(), HasSubstr("--tls-ca"));

  ScratchDir dir;
  TlsFiles not_pem{Write(dir, "cert.pem", "hello"), Write(dir, "key.pem", ""), ""};
  auto bad = MakeServerCredentials(not_pem);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--tls-cert"));
  EXPECT_THAT(bad.status().message(), HasSubstr("cert.pem"));
  TlsFiles missing_ca;
  missing_ca.ca = dir.path() + "/absent-ca.pem";
  auto no_ca = MakeChannelCredentials(missing_ca);
  EXPECT_THAT(no_ca.status().message(), HasSubstr("--tls-ca"));
  EXPECT_THAT(no_ca.status().message(), HasSubstr("absent-ca.pem"));
}

}  // namespace
}  // namespace stagecoach::rpc::rpc_security_test
