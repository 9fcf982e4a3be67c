// The daemons' flag set (common/daemon/flag_set.h): one declaration gives the command line, the
// --config YAML keys and the typed value; the command line wins over the file, the file over
// the environment, the environment over the destination's default; every error names the flag,
// or the file and the key.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/daemon/daemon.h"
#include "common/daemon/flag_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::daemon::daemon_flags_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Destinations with their defaults, as a daemon's options struct holds them.
struct Values {
  std::string name = "none";
  absl::Duration lease = absl::Seconds(10);
  int64_t upload = 1024;
  int events = 100;
  bool strict = false;
  bool check = false;
  rpc::HostPort listen{"0.0.0.0", 7070};
  std::optional<rpc::HostPort> metrics;
  std::optional<rpc::HostPort> peer;
  std::string token;
};

class FlagSetTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv(kEnv); }
  void TearDown() override { unsetenv(kEnv); }

  // A fresh flag set over `v_` (declared like a daemon declares its flags).
  std::unique_ptr<FlagSet> Declare() {
    v_ = Values();
    auto flags = std::make_unique<FlagSet>("test daemon");
    flags->AddString("name", &v_.name, "a name");
    flags->AddDuration("lease", &v_.lease, "a lease");
    flags->AddInt("max-upload-bytes", &v_.upload, 1, "bytes", "upload limit");
    flags->AddInt("max-events", &v_.events, 0, "events", "event limit");
    flags->AddBool("strict", &v_.strict, "a switch");
    flags->AddBool("check-config", &v_.check, "validate and exit").CommandLineOnly();
    flags->AddHostPort("listen", &v_.listen, "where to listen");
    flags->AddHostPort("metrics-listen", &v_.metrics, "metrics address");
    flags->AddHostPort("peer", &v_.peer, "the peer").DefaultFromEnv(kEnv);
    flags->AddTokenFile("token-file", &v_.token, "a token file");
    return flags;
  }

  absl::StatusOr<FlagSet::Outcome> Parse(FlagSet& flags, std::vector<std::string> args) {
    args.insert(args.begin(), "test-daemon");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    return flags.Parse(static_cast<int>(argv.size()), argv.data());
  }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  static constexpr char kEnv[] = "STAGECOACH_FLAG_SET_TEST_PEER";
  stagecoach::testing::TempDir tmp_{"daemon_flags_test"};
  const std::string dir_ = tmp_.path();
  Values v_;
};

TEST_F(FlagSetTest, DefaultsAreTheDestinationsValues) {
  auto flags = Declare();
  v_.name = "overwritten before Parse";  // the default was taken at declaration
  auto parsed = Parse(*flags, {});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, FlagSet::Outcome::kRun);
  EXPECT_EQ(v_.name, "none");
  EXPECT_EQ(v_.lease, absl::Seconds(10));
  EXPECT_EQ(v_.upload, 1024);
  EXPECT_EQ(v_.events, 100);
  EXPECT_FALSE(v_.strict);
  EXPECT_EQ(v_.listen.ToString(), "0.0.0.0:7070");
  EXPECT_FALSE(v_.metrics.has_value());
  EXPECT_FALSE(v_.peer.has_value());
  EXPECT_EQ(v_.token, "");
}

TEST_F(FlagSetTest, CommandLineValuesAreTyped) {
  auto flags = Declare();
  const std::string token = Write("t.token", "s3cret\n");
  auto parsed = Parse(*flags, {"--name", "w0", "--lease", "1m30s", "--max-upload-bytes", "5",
                               "--max-events=0", "--strict", "--listen", "[::1]:0",
                               "--metrics-listen", "127.0.0.1:9090", "--token-file", token});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(v_.name, "w0");
  EXPECT_EQ(v_.lease, absl::Seconds(90));
  EXPECT_EQ(v_.upload, 5);
  EXPECT_EQ(v_.events, 0);
  EXPECT_TRUE(v_.strict);
  EXPECT_EQ(v_.listen.host, "::1");
  EXPECT_EQ(v_.listen.port, 0);
  ASSERT_TRUE(v_.metrics.has_value());
  EXPECT_EQ(v_.metrics->ToString(), "127.0.0.1:9090");
  EXPECT_EQ(v_.token, "s3cret");
}

TEST_F(FlagSetTest, CommandLineWinsOverTheFileAndTheFileOverTheEnvironment) {
  setenv(kEnv, "env-host:1", 1);
  auto flags = Declare();
  const std::string config = Write("d.yaml",
                                   "name: from-file\n"
                                   "lease: 20s\n"
                                   "max_upload_bytes: 77\n"  // '_' spells '-' too
                                   "strict: yes\n"
                                   "peer: file-host:2\n");
  auto parsed = Parse(*flags, {"--config", config, "--lease", "3s"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(v_.name, "from-file");
  EXPECT_EQ(v_.lease, absl::Seconds(3));
  EXPECT_EQ(v_.upload, 77);
  EXPECT_TRUE(v_.strict);
  ASSERT_TRUE(v_.peer.has_value());
  EXPECT_EQ(v_.peer->ToString(), "file-host:2");

  auto again = Declare();
  ASSERT_TRUE(Parse(*again, {}).ok());
  ASSERT_TRUE(v_.peer.has_value());
  EXPECT_EQ(v_.peer->ToString(), "env-host:1") << "the environment replaces the default";

  auto off = Declare();
  const std::string switched_off = Write("off.yaml", "strict: false\n");
  ASSERT_TRUE(Parse(*off, {"--config", switched_off, "--strict"}).ok());
  EXPECT_TRUE(v_.strict) << "the switch on the command line wins";
}

TEST_F(FlagSetTest, TheFileIsRefusedNamingItAndTheKey) {
  const std::string unknown = Write("unknown.yaml", "name: x\nbogus: 1\n");
  auto parsed = Parse(*Declare(), {"--config", unknown});
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr(unknown + ": bogus: unknown option"));

  const std::string command_line_only = Write("cl.yaml", "check-config: true\n");
  parsed = Parse(*Declare(), {"--config", command_line_only});
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("check-config: unknown option"));
  parsed = Parse(*Declare(), {"--config", Write("self.yaml", "config: other.yaml\n")});
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("config: unknown option"));

  const std::string nested = Write("nested.yaml", "lease: {seconds: 3}\n");
  parsed = Parse(*Declare(), {"--config", nested});
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr(nested + ": lease: must be a scalar"));

  parsed = Parse(*Declare(), {"--config", dir_ + "/missing.yaml"});
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kNotFound) << parsed.status();
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("missing.yaml"));
}

TEST_F(FlagSetTest, BadValuesNameTheFlagAndWhereTheyCameFrom) {
  struct Bad {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {{"--lease", "soon"},
       "--lease: must be a positive duration like 500ms, 10s or 1m, got 'soon'"},
      {{"--lease", "0s"}, "--lease: must be a positive duration"},
      {{"--max-upload-bytes", "lots"},
       "--max-upload-bytes: must be a positive number of bytes, got 'lots'"},
      {{"--max-upload-bytes", "0"},
       "--max-upload-bytes: must be a positive number of bytes, got '0'"},
      {{"--max-events", "-1"}, "--max-events: must be a number of events >= 0, got '-1'"},
      {{"--max-events", "3000000000"}, "--max-events: must be a number of events >= 0"},
      {{"--listen", "nohostport"}, "--listen"},
      {{"--metrics-listen", "127.0.0.1:99999"}, "--metrics-listen"},
      {{"--token-file", "/nonexistent/t.token"}, "--token-file"},
      {{"--frobnicate"}, "--frobnicate"},
  };
  for (const Bad& b : cases) {
    auto parsed = Parse(*Declare(), b.args);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << b.args[0];
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(b.message)) << b.args[0];
  }
  const std::string config = Write("bad.yaml", "lease: soon\n");
  auto parsed = Parse(*Declare(), {"--config", config});
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("--lease: must be a positive"));
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(config));
  parsed = Parse(*Declare(), {"--config", Write("bool.yaml", "strict: maybe\n")});
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("--strict: must be true or false, got 'maybe'"));
}

TEST_F(FlagSetTest, RequiredFlagSaysHowToSetIt) {
  FlagSet required("test daemon");
  std::optional<rpc::HostPort> coordinator;
  required.AddHostPort("coordinator", &coordinator, "the coordinator")
      .DefaultFromEnv(kEnv)
      .Required();
  auto parsed = Parse(required, {});
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(),
            std::string("--coordinator: required (or set ") + kEnv + ")");

  setenv(kEnv, "127.0.0.1:7070", 1);
  FlagSet from_env("test daemon");
  from_env.AddHostPort("coordinator", &coordinator, "the coordinator")
      .DefaultFromEnv(kEnv)
      .Required();
  parsed = Parse(from_env, {});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(coordinator->ToString(), "127.0.0.1:7070");
}

TEST_F(FlagSetTest, HelpIsShownAndNothingIsSet) {
  auto flags = Declare();
  auto parsed = Parse(*flags, {"--lease", "1s", "--help"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, FlagSet::Outcome::kHelpShown);
  EXPECT_EQ(v_.lease, absl::Seconds(10));
}

// Takes two locks in one order, then in the other: a lock-order cycle Abseil's deadlock
// detection reports (and aborts on, in kAbort mode).
void LockInOppositeOrders() {
  absl::Mutex a;
  absl::Mutex b;
  {
    absl::MutexLock first(&a);
    absl::MutexLock second(&b);
  }
  {
    absl::MutexLock first(&b);
    absl::MutexLock second(&a);
  }
}

// Configures a daemon (in a death test's child: Configure blocks the termination signals) with
// --check-config and `extra`, then takes two locks in opposite orders and exits 0.
void ConfigureThenLockInOppositeOrders(const std::vector<std::string>& extra) {
  DaemonInfo info;
  info.name = "lock-order-test";
  info.description = "a daemon for the test";
  info.default_listen = "127.0.0.1:0";
  Daemon daemon(info);
  std::vector<std::string> args = {"stagecoach-lock-order-test", "--check-config", "--log-level",
                                   "off"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const std::optional<int> configured =
      daemon.Configure(static_cast<int>(argv.size()), argv.data());
  if (configured != 0) _exit(3);  // --check-config: "configuration ok", 0
  LockInOppositeOrders();
  _exit(0);
}

// Whether this Abseil was built with its deadlock detection (not with NDEBUG): a child that
// asks for it and takes two locks in opposite orders dies.
bool AbseilDetectsLockOrderCycles() {
  const pid_t child = fork();
  if (child == 0) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
    LockInOppositeOrders();
    _exit(0);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child) return false;
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Off by default (the checks cost the coordinator half its placement speed at 4,096 workers,
// docs/fleet.md); --debug-lock-order turns them on, and a cycle then aborts naming it.
TEST(DebugLockOrderFlag, OnlyWithTheFlagDoesALockOrderCycleAbortTheDaemon) {
  if (!AbseilDetectsLockOrderCycles()) {
    GTEST_SKIP() << "this Abseil was built without its deadlock detection (NDEBUG)";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ConfigureThenLockInOppositeOrders({}), ::testing::ExitedWithCode(0), "");
  EXPECT_DEATH(ConfigureThenLockInOppositeOrders({"--debug-lock-order"}),
               "Potential Mutex deadlock");
}

}  // namespace
}  // namespace stagecoach::daemon::daemon_flags_test
