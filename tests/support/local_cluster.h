// A coordinator and workers as real processes on loopback, plus stagectl, for end-to-end tests.
// Every daemon listens on port 0 and the cluster reads the address each one prints first.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/channel.h"
#include "stagecoach/v1/coordinator.grpc.pb.h"
#include "tests/support/process.h"

namespace stagecoach::testing {

// Where a daemon runs: the command line before its own (a host in a network namespace:
// tests/support/netns/hosts.h's Launcher) and the address it listens on and is reached at.
struct DaemonHost {
  std::vector<std::string> launcher;
  std::string address = "127.0.0.1";
};

struct ClusterOptions {
  int workers = 2;
  std::string lease = "3s";
  std::string heartbeat_interval = "500ms";
  std::string comm_timeout = "30s";
  // Every daemon's --log-level (benchmarks measure at the default, info).
  std::string log_level = "debug";
  // --debug-lock-order on every daemon: tests abort on a lock-order cycle; benchmarks measure
  // the daemons as they run in production, without it.
  bool check_lock_order = true;
  // Extra flags for every worker, e.g. {"--device", "cuda:0"}.
  std::vector<std::string> worker_args;
  // Extra flags for the coordinator, e.g. {"--metrics-listen", "127.0.0.1:0"}.
  std::vector<std::string> coordinator_args;

  // Security (docs/security.md); empty paths leave it off. With `tls_ca`, the coordinator and
  // workers serve TLS with `tls_server_cert`/`tls_server_key` (also their client certificate when
  // they call each other) and verify peers against `tls_ca`; the cluster's own calls and
  // Stagectl() present `tls_client_cert`/`tls_client_key` when set.
  std::string tls_ca;
  std::string tls_server_cert, tls_server_key;
  std::string tls_client_cert, tls_client_key;
  bool tls_require_client_cert = false;  // mutual TLS on every daemon
  // The coordinator's --client-token-file (the cluster's calls and Stagectl() send it) and
  // --worker-token-file (the workers' --coordinator-token-file).
  std::string client_token_file;
  std::string worker_token_file;

  // Another build of the daemons (its binary dir), started behind `launcher`, e.g. {chroot DIR
  // env USE_LIBUV=0} with the build's path as seen inside DIR; both empty: this build's daemons.
  // stagectl is always this build's.
  std::string daemon_binary_dir;
  std::vector<std::string> launcher;

  // Where the coordinator runs, and worker i (worker_hosts[i]: as many as workers, and those
  // added later); empty: on this machine's loopback. A host's launcher goes before `launcher`.
  DaemonHost coordinator_host;
  std::vector<DaemonHost> worker_hosts;
};

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const ClusterOptions& options);
  // Stops every process it started.
  ~LocalCluster();

  const std::string& coordinator_address() const { return coordinator_address_; }
  const std::string& dir() const { return dir_.path(); }

  // Starts one more worker (with `extra_args` after ClusterOptions::worker_args) on its
  // ClusterOptions::worker_hosts entry; returns its index.
  absl::StatusOr<int> AddWorker(const std::vector<std::string>& extra_args = {});
  ChildProcess& worker(int i) { return *workers_[i]; }
  // The coordinator process (its stdout after the "listening on" line is the test's to read).
  ChildProcess& coordinator() { return *coordinator_; }
  // Kills the coordinator (SIGKILL: no shutdown work) and starts a new one with the same flags on
  // the same address, which the workers keep calling; its stderr goes to coordinator-<n>.log.
  // The cluster's calls go to the new process. Keep state across it with --data-dir in
  // ClusterOptions::coordinator_args.
  absl::Status RestartCoordinator();
  int num_workers() const { return static_cast<int>(workers_.size()); }
  // The index of the worker process registered under `worker_id` ("w-3"), or -1.
  int WorkerIndex(const std::string& worker_id);

  // Waits until at least `n` workers are IDLE.
  absl::Status WaitForIdleWorkers(int n, absl::Duration timeout);

  // Runs stagectl with --coordinator set, then `args`.
  CommandResult Stagectl(const std::vector<std::string>& args,
                         absl::Duration timeout = absl::Seconds(120));

  // The whole job, every step of its history (GetJobRequest.history_all).
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // SubmitJob of `spec_yaml` (held before its first step when `paused`): the job id.
  absl::StatusOr<std::string> Submit(const std::string& spec_yaml, bool paused = false);
  // CancelJob.
  absl::Status Cancel(const std::string& job_id);
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();
  // Polls GetJob until `done(job)` or `timeout`.
  absl::StatusOr<v1::Job> WaitForJob(const std::string& job_id,
                                     const std::function<bool(const v1::Job&)>& done,
                                     absl::Duration timeout);
  // Submit, then WaitForJob until the job is in `state` or has ended.
  absl::StatusOr<v1::Job> SubmitAndWait(const std::string& spec_yaml, bool paused,
                                        v1::JobState state, absl::Duration timeout);

  // Writes `text` to a file in the cluster's directory; returns its path.
  std::string WriteFile(const std::string& name, const std::string& text);

  // Logs of every process (stderr tails, each headed by ChildProcess::Describe), for failure
  // messages.
  std::string Logs();

 private:
  // `path` (kWorkerPath, kCoordinatorPath) under the daemons' binary dir.
  std::string DaemonBinary(const std::string& path) const;
  LocalCluster() = default;

  TempDir dir_;
  std::string coordinator_address_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::string> coordinator_argv_;  // as first started (--listen 127.0.0.1:0)
  int coordinator_starts_ = 0;
  rpc::ChannelSecurity security_;  // of the cluster's own calls
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::vector<std::string> worker_addresses_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::vector<std::string> worker_args_;
  std::string log_level_;
  std::string daemon_binary_dir_;           // ClusterOptions::daemon_binary_dir
  std::vector<std::string> launcher_;       // ClusterOptions::launcher
  std::vector<DaemonHost> worker_hosts_;    // ClusterOptions::worker_hosts
  std::vector<std::string> stagectl_args_;  // TLS and token flags
};

// Paths of the binaries under test.
std::string CoordinatorBinary();
std::string WorkerBinary();
std::string StagectlBinary();

// The address of the "metrics on HOST:PORT" line a daemon started with --metrics-listen prints
// after its "listening on" line (read that one first).
absl::StatusOr<std::string> ReadMetricsAddress(ChildProcess& daemon);

}  // namespace stagecoach::testing
